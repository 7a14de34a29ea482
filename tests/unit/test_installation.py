"""convplane's four generic top-level packages must come from its own installation
(``services.deploy.installation``): a shadowing directory or a clashing distribution is named."""

from __future__ import annotations

from pathlib import Path

from services.deploy.installation import claim_problems, installation_problems, origin_problems

SITE = Path("/venv/lib/python3.11/site-packages")
OWN = {name: SITE / name / "__init__.py" for name in ("eventlog", "regions", "replay", "services")}


def test_this_checkout_has_no_problems() -> None:
    assert installation_problems() == []


def test_packages_from_one_directory_have_no_problems() -> None:
    assert origin_problems(OWN) == []
    assert claim_problems({"replay": ["convplane"], "yaml": ["PyYAML"]}) == []


def test_a_package_imported_from_elsewhere_is_named() -> None:
    problems = origin_problems({**OWN, "replay": Path("/home/me/work/replay/__init__.py")})
    assert problems == [
        "'replay' was imported from /home/me/work/replay, not from "
        f"{SITE / 'replay'} where convplane's other packages are: another package of that name "
        "shadows it"
    ]


def test_a_bare_directory_of_that_name_is_named() -> None:
    (problem,) = origin_problems({**OWN, "regions": None})
    assert problem.startswith("'regions' is a directory without __init__.py")


def test_another_distribution_installing_the_same_name_is_named() -> None:
    (problem,) = claim_problems(
        {"services": ["convplane", "some_services"], "replay": ["Convplane"]}
    )
    assert "some_services also installs a top-level package 'services'" in problem
