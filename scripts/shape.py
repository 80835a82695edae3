#!/usr/bin/env python3
"""The workspace's shape, as issue 37 measures it: each crate's share of the code lines
outside tests, the largest files, and the files of a crate that import each other.

A code line is a non-blank line of a `src/` file that is not a `//` comment; test files
(`tests.rs`, `*_tests.rs`) and `#[cfg(test)] mod ... { }` blocks do not count. A file
imports another when it names `crate::<module>` outside a comment (the crate root,
`lib.rs`, declares every module and is left out).

    python3 scripts/shape.py [ROOT]
"""
import os
import re
import sys

SKIP_DIRS = {"target", ".git", "device-carry", "tests", "benches", "fuzz", "node_modules"}


def rust_files(root):
    for d, ds, fs in os.walk(root):
        ds[:] = sorted(x for x in ds if x not in SKIP_DIRS)
        if "/src" not in d.replace(os.sep, "/"):
            continue
        for f in sorted(fs):
            if f.endswith(".rs") and not f.endswith("tests.rs"):
                yield os.path.join(d, f)


def without_tests(text):
    """The file's lines, `#[cfg(test)] mod x { ... }` blocks removed."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        if lines[i].strip() == "#[cfg(test)]" and i + 1 < len(lines) and re.match(
            r"\s*(pub\s+)?mod \w+\s*\{", lines[i + 1]
        ):
            depth, i = 0, i + 1
            while i < len(lines):
                depth += lines[i].count("{") - lines[i].count("}")
                i += 1
                if depth <= 0:
                    break
            continue
        out.append(lines[i])
        i += 1
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    crates, files, modules = {}, [], {}
    for path in rust_files(root):
        rel = os.path.relpath(path, root)
        crate, _, inner = rel.partition(os.sep + "src" + os.sep)
        lines = without_tests(open(path, encoding="utf-8", errors="replace").read())
        code = [l for l in lines if l.strip() and not l.strip().startswith("//")]
        crates[crate] = crates.get(crate, 0) + len(code)
        files.append((len(open(path, encoding="utf-8", errors="replace").read().split("\n")), rel))
        top = inner[:-3].split(os.sep)[0]
        if top not in ("lib", "main") and os.sep + "bin" + os.sep not in rel:
            modules.setdefault(crate, {}).setdefault(top, []).extend(code)
    total = sum(crates.values())
    print(f"code lines outside tests: {total}")
    for crate, n in sorted(crates.items(), key=lambda x: -x[1])[:10]:
        print(f"  {crate:24s} {n:6d} {100 * n / total:5.1f}%")
    print("largest files (lines, tests included):")
    for n, rel in sorted(files, reverse=True)[:5]:
        print(f"  {n:6d} {rel}")
    print("files that import each other:")
    found = False
    for crate, mods in sorted(modules.items()):
        def named(code):
            text = "\n".join(code)
            names = set(re.findall(r"crate::([a-z_0-9]+)", text))
            for group in re.findall(r"crate::\{([^}]*)\}", text):
                names |= set(re.findall(r"(?:^|[\s,{])([a-z_0-9]+)(?=::|\s*,|\s*$)", group))
            return names

        edges = {m: {r for r in named(code) if r in mods and r != m} for m, code in mods.items()}
        for a in sorted(edges):
            for b in sorted(edges[a]):
                if a < b and a in edges.get(b, ()):
                    print(f"  {crate}: {a} <-> {b}")
                    found = True
    if not found:
        print("  none")


if __name__ == "__main__":
    main()
