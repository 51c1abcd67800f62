"""Rewrites the flag tables in docs/flags.md from appo.py's argparse definitions.

    python scripts/update_flag_docs.py

Run it after adding or changing a flag; tests/test_config.py checks that every flag is documented.
"""
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import appo  # noqa: E402


# Defaults computed from the machine's core count: the table names the rule, not this machine's value.
MACHINE_DEPENDENT_DEFAULTS = {"num_workers": "CPU count", "learner_threads": "half the CPU cores, 1 to 4"}


def flag_tables() -> str:
    lines = ["Every flag, with its default (`python appo.py --help` prints the same; `python appo.py --env",
             "atari_breakout --help` prints that env family's defaults). A switch is on with `--name`, off with",
             "`--no-name`, and also takes `--name=True` / `--name=False`, as Sample Factory's launcher passes it.", ""]
    for group in appo.build_parser()._action_groups:
        actions = [action for action in group._group_actions if action.dest != "help"]
        if not actions:
            continue
        lines += [f"**{group.title}**", "", "| flag | default | meaning |", "|---|---|---|"]
        for action in actions:
            default = MACHINE_DEPENDENT_DEFAULTS.get(action.dest, action.default)
            cells = [f"`{' / '.join(action.option_strings)}`", str(default), action.help.replace("%%", "%")]
            # a bare | ends a table cell, in code spans too: GitHub's tables take \| for one
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main():
    path = os.path.join(REPO, "docs", "flags.md")
    with open(path) as f:
        text = f.read()
    start = text.index("Every flag, with its default")  # the tables run to the end of the page
    with open(path, "w") as f:
        f.write(text[:start] + flag_tables())
    print(f"updated the flag tables in {path}")


if __name__ == "__main__":
    main()
