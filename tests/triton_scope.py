"""A scope check of printed Triton kernels: Triton compiles a kernel's control flow to structured blocks, so
a name first bound inside a ``for`` (or one branch of an ``if``) does not exist after it. Python, and hence
``TRITON_INTERPRET=1`` on a CPU, keeps it: such a kernel passes every CPU test and fails to compile on a GPU."""

from __future__ import annotations

import ast
import builtins


def unbound_reads(source: str) -> list[str]:
    """``name (line N)`` for each read of a name no enclosing block binds first, in every jitted function."""
    tree = ast.parse(source)
    module = set(dir(builtins))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            module.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            module.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            module.update(t.id for t in node.targets if isinstance(t, ast.Name))
    bad: list[str] = []

    def reads(node: ast.AST, bound: set[str]) -> None:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load) and sub.id not in bound | module:
                bad.append(f"{sub.id} (line {sub.lineno})")

    def block(stmts: list[ast.stmt], bound: set[str]) -> set[str]:
        bound = set(bound)
        for st in stmts:
            if isinstance(st, ast.For):
                reads(st.iter, bound)
                inner = bound | {n.id for n in ast.walk(st.target) if isinstance(n, ast.Name)}
                block(st.body, inner)  # what it binds anew is gone after it
            elif isinstance(st, ast.While):
                reads(st.test, bound)
                block(st.body, bound)
            elif isinstance(st, ast.If):
                reads(st.test, bound)
                bound |= block(st.body, bound) & block(st.orelse, bound)  # bound after it only if both bind it
            else:
                value = getattr(st, "value", None)
                if isinstance(st, ast.AugAssign):
                    reads(st.target, bound)
                if value is not None:
                    reads(value, bound)
                elif not isinstance(st, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                    reads(st, bound)
                for t in getattr(st, "targets", [getattr(st, "target", None)]):
                    if t is not None:
                        bound |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        return bound

    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
            block(node.body, {a.arg for a in node.args.args})
    return bad
