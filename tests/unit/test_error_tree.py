"""Every error a caller can catch is in the one documented tree (``eventlog.errors``'s docstring),
under the parent and with the status the tree shows, and its code is unique."""

from __future__ import annotations

import importlib
import pkgutil
import re

import eventlog.errors
from eventlog.errors import ConvplaneError

PRODUCT = ("eventlog", "regions", "replay", "services")


def all_errors() -> list[type[ConvplaneError]]:
    for package in PRODUCT:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if ".migrations" not in info.name:
                importlib.import_module(info.name)
    found: list[type[ConvplaneError]] = []
    pending = [ConvplaneError]
    while pending:
        cls = pending.pop()
        for sub in cls.__subclasses__():
            found.append(sub)
            pending.append(sub)
    return found


def documented_tree() -> dict[str, tuple[str, int | None]]:
    """class name -> (parent name, status shown) from the docstring's drawing."""
    doc = eventlog.errors.__doc__ or ""
    tree: dict[str, tuple[str, int | None]] = {}
    parents: list[str] = ["ConvplaneError"]
    for line in doc.splitlines():
        match = re.match(r"^ {4}([│ ]*)[├└]── (\w+)(?:\s+(\d{3}))?", line)
        if match is None:
            continue
        depth = len(match.group(1)) // 4
        name, status = match.group(2), match.group(3)
        del parents[depth + 1 :]
        tree[name] = (parents[depth], int(status) if status else None)
        parents.append(name)
    return tree


def test_every_error_class_is_in_the_documented_tree_under_its_parent() -> None:
    tree = documented_tree()
    errors = all_errors()
    assert len(tree) == len(errors) >= 30  # (the drawing parsed)
    for cls in errors:
        assert cls.__name__ in tree, f"{cls.__module__}.{cls.__name__} is not in the error tree"
        parent, status = tree[cls.__name__]
        assert cls.__bases__[0].__name__ == parent, cls
        if status is not None:
            assert cls.http_status == status, cls


def test_error_codes_are_unique() -> None:
    codes = [cls.code for cls in all_errors()]
    assert len(codes) == len(set(codes))
