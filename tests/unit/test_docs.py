"""The repository's Markdown points only at files it has: a link to a path that is not there
is a reader sent nowhere (#44 found one)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def markdown_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.split()
    return [ROOT / name for name in listed] or sorted(ROOT.glob("**/*.md"))


def test_every_relative_link_in_the_markdown_points_at_a_file_that_exists() -> None:
    files = markdown_files()
    assert any(f.name == "README.md" for f in files)
    broken = []
    for doc in files:
        for match in LINK.finditer(doc.read_text(encoding="utf-8")):
            target = match.group(1)
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue  # a URL, or a heading of the same page
            path = target.split("#", 1)[0]
            if not (doc.parent / path).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert broken == []


# Packages the layout names as a whole: each has a README or is named by what it is for.
WHOLE = ("fakes", "demo", "simulation")


def test_the_controller_s_layout_names_every_module() -> None:
    """controller/README.md's layout is the tree: a module added or moved without it there
    fails here."""
    text = (ROOT / "controller" / "README.md").read_text()
    start = text.index("```\ncontroller/")
    block = text[start : text.index("```", start + 3)]
    package = ROOT / "controller"
    missing = [
        str(path.relative_to(package))
        for path in sorted(package.rglob("*.py"))
        if path.name != "__init__.py"
        and path.relative_to(package).parts[0] not in WHOLE
        and path.name not in block
    ]
    assert missing == [], f"not in controller/README.md's layout: {missing}"


def test_the_error_tree_atop_errors_py_names_every_error_under_its_parent() -> None:
    import inspect

    from controller import errors

    assert errors.__doc__ is not None
    drawn: dict[str, str | None] = {}  # name → parent, from the tree's indentation
    stack: list[tuple[int, str]] = []
    for line in errors.__doc__.splitlines():
        found = re.match(r"^([│ ]*(?:[├└]── )?)([A-Z]\w*Error)\b", line)
        if found is None:
            continue
        depth = len(found.group(1))
        while stack and stack[-1][0] >= depth:
            stack.pop()
        drawn[found.group(2)] = stack[-1][1] if stack else None
        stack.append((depth, found.group(2)))
    defined: dict[str, str | None] = {
        name: cls.__bases__[0].__name__ if cls is not errors.WeightControllerError else None
        for name, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.WeightControllerError) and cls.__module__ == errors.__name__
    }
    assert drawn == defined


def test_the_commit_msg_hook_refuses_a_subject_past_72_characters(tmp_path: Path) -> None:
    hook = ROOT / ".githooks" / "commit-msg"
    cases = (("a" * 72, 0), ("é" * 72, 0), ("\n" + "a" * 72, 0), ("a" * 73, 1), ("é" * 73, 1))
    for subject, code in cases:
        message = tmp_path / "MSG"
        message.write_text(f"# git's note\n{subject}\n\nThe why, with figures, at any length.\n")
        for locale in ("C", "C.UTF-8"):
            done = subprocess.run(
                [str(hook), str(message)],
                capture_output=True,
                text=True,
                env={"PATH": os.environ.get("PATH", ""), "LC_ALL": locale},
            )
            assert done.returncode == code, (len(subject), locale, done.stderr)
    # an empty message: no subject at all
    message.write_text("# git's note\n\n")
    assert subprocess.run([str(hook), str(message)], capture_output=True).returncode == 1
