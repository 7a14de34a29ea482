"""Every exception class the product defines is in a documented tree (``eventlog.errors``'s
docstring), under the parent and with the status the tree shows; error codes are unique.

The docstring draws two trees: ``ConvplaneError``'s (the API errors) and the other exceptions,
under the builtins they derive from. Private classes (a leading underscore: a module's own
control flow) are not drawn."""

from __future__ import annotations

import builtins
import importlib
import inspect
import pkgutil
import re

import eventlog.errors
from eventlog.errors import ConvplaneError

PRODUCT = ("eventlog", "regions", "replay", "services")


def product_exceptions() -> list[type[BaseException]]:
    """Every public exception class defined in a product module."""
    found: list[type[BaseException]] = []
    for package in PRODUCT:
        root = importlib.import_module(package)
        modules = [root] + [
            importlib.import_module(info.name)
            for info in pkgutil.walk_packages(root.__path__, f"{package}.")
            if ".migrations" not in info.name
        ]
        for module in modules:
            for name, obj in vars(module).items():
                if (
                    inspect.isclass(obj)
                    and issubclass(obj, BaseException)
                    and obj.__module__ == module.__name__
                    and not name.startswith("_")
                ):
                    found.append(obj)
    return found


def all_errors() -> list[type[ConvplaneError]]:
    product_exceptions()  # imports every product module
    found: list[type[ConvplaneError]] = []
    pending = [ConvplaneError]
    while pending:
        cls = pending.pop()
        for sub in cls.__subclasses__():
            found.append(sub)
            pending.append(sub)
    return found


def documented_tree() -> dict[str, tuple[str | None, int | None]]:
    """class name -> (parent name, status shown) from the docstring's drawings; a drawing's root
    has no parent there."""
    doc = eventlog.errors.__doc__ or ""
    tree: dict[str, tuple[str | None, int | None]] = {}
    parents: list[str] = []
    for line in doc.splitlines():
        root = re.match(r"^ {4}(\w+)\s*$", line)
        if root is not None:
            parents = [root.group(1)]
            tree[root.group(1)] = (None, None)
            continue
        match = re.match(r"^ {4}([│ ]*)[├└]── (\w+)(?:\s+(\d{3}))?", line)
        if match is None:
            continue
        depth = len(match.group(1)) // 4
        name, status = match.group(2), match.group(3)
        del parents[depth + 1 :]
        tree[name] = (parents[depth], int(status) if status else None)
        parents.append(name)
    return tree


def test_the_drawings_parse() -> None:
    tree = documented_tree()
    assert tree["InvalidRequest"] == ("ConvplaneError", 400)
    assert tree["PgHarnessError"] == ("HarnessError", None)
    assert tree["HarnessError"] == ("RuntimeError", None)


def test_every_exception_class_is_in_a_documented_tree_under_its_parent() -> None:
    tree = documented_tree()
    classes = product_exceptions()
    assert len(classes) >= 40
    for cls in classes:
        assert cls.__name__ in tree, f"{cls.__module__}.{cls.__name__} is not in an error tree"
        parent, status = tree[cls.__name__]
        assert parent is None or cls.__bases__[0].__name__ == parent, cls
        if status is not None:
            assert issubclass(cls, ConvplaneError) and cls.http_status == status, cls
    drawn = {name for name in tree if not hasattr(builtins, name)}
    assert drawn == {cls.__name__ for cls in classes}, "a drawn class that is not defined"


def test_every_api_error_is_drawn_under_convplane_error() -> None:
    tree = documented_tree()
    for cls in all_errors():
        name: str | None = cls.__name__
        while name is not None and name != "ConvplaneError":
            name = tree[name][0]
        assert name == "ConvplaneError", cls


def test_error_codes_are_unique() -> None:
    codes = [cls.code for cls in all_errors()]
    assert len(codes) == len(set(codes))
