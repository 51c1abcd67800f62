"""docs/fork.md's table of what each common change needs read: every count it gives for named
definitions is their line span in appo.py (or env.py) at this commit, counted here from the code."""
import ast
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def definition_spans(path: str) -> dict[str, int]:
    """Lines of each top-level function, class and assignment, and of each method as Class.method."""
    with open(path) as f:
        tree = ast.parse(f.read())
    spans = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            spans[node.name] = node.end_lineno - node.lineno + 1
            for member in node.body if isinstance(node, ast.ClassDef) else []:
                if isinstance(member, ast.FunctionDef):
                    spans[f"{node.name}.{member.name}"] = member.end_lineno - member.lineno + 1
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    spans[target.id] = node.end_lineno - node.lineno + 1
    return spans


def counted_groups(cell: str) -> list[tuple[list[str], int]]:
    """The read cell's groups: the backticked names before each "(N)" (or "(N: ..."), since the last one."""
    groups, start = [], 0
    for match in re.finditer(r"\((\d+)[:)]", cell):
        text = cell[start:match.start()]
        groups.append((re.findall(r"`([^`]+)`", text), int(match.group(1)), text))
        start = match.end()
    return groups


def test_fork_mds_line_counts_are_the_definitions_spans_at_this_commit():
    spans = {**definition_spans(os.path.join(REPO, "env.py")), **definition_spans(os.path.join(REPO, "appo.py"))}
    with open(os.path.join(REPO, "docs", "fork.md")) as f:
        fork = f.read()
    rows = [line.split(" | ") for line in fork.splitlines() if line.startswith("| ") and line.count(" | ") == 2]
    checked = 0
    for change, read, _ in rows[1:]:
        for names, count, text in counted_groups(read):
            # a group is the named definitions whole, unless it reads a part of one (its lines, a docstring)
            if not names or any(name not in spans for name in names) or re.search(r"lines of|docstring|flag", text):
                continue
            assert sum(spans[name] for name in names) == count, (change, names, count,
                                                                  {name: spans[name] for name in names})
            checked += 1
    assert checked >= 15  # most of the table's groups are whole definitions
