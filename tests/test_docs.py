"""The README's Quick start stays true: CI runs its test command, and it names every setting."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.strip().splitlines() if line.strip() and not line.startswith("#")]


def test_quick_start_has_exactly_two_commands():
    commands = quick_start_commands()
    assert len(commands) == 2, commands
    assert "tunekit " in commands[0] and "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert quick_start_commands()[1] in ci.splitlines()


def test_architecture_doc_names_every_runtime_module():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    for module in (ROOT / "src" / "tunekit" / "tunable").glob("*.py"):
        if module.name != "__init__.py":
            assert module.name in doc, f"docs/architecture.md does not mention {module.name}"
