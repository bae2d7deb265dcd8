#!/usr/bin/env python3
"""Fails when source files of one crate import each other, two directly or more around a loop.

Usage: .ci/import-cycles.py [CRATE_SRC_DIR ...]   (default: crates/*/src and loadgen/src)

A file "imports" another when it names a path into that file's module: `use crate::a::b::X`,
`crate::a::b::f()`, `super::X`, `self::x::Y`, `use child::X` (a child module named relative to
this one), braces expanded (`use crate::{a::X, b::Y}`).
A path resolves to the deepest module that has a file of its own (`a.rs` or `a/mod.rs`), so
an item re-exported by a parent module counts as an import of the parent's file. Inline
`mod x { ... }` blocks (tests) are followed for `super`. Declaring a child (`mod x;`) is not an
import. Comments and string literals are ignored.
"""
import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
PATH = re.compile(rf"\b(crate|super|self)((?:::{IDENT})+)")
USE = re.compile(r"\buse\s+([^;]+);", re.S)
INLINE_MOD = re.compile(rf"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+({IDENT})\s*\{{")


def strip(text):
    """Removes comments, string and char literals (keeps line structure)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            seg = text[i:n if j < 0 else j + 2]
            out.append("\n" * seg.count("\n"))
            i = n if j < 0 else j + 2
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = '"' + hashes
            j = text.find(end, i + 2 + len(hashes))
            seg = text[i:n if j < 0 else j + len(end)]
            out.append('""' + "\n" * seg.count("\n"))
            i = n if j < 0 else j + len(end)
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            seg = text[i:j + 1]
            out.append('""' + "\n" * seg.count("\n"))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4] + "    "):
            m = re.match(r"'(\\.|[^\\'])'", text[i:])
            out.append("' '")
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def expand(use_body):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e'] (aliases and globs dropped)."""
    body = re.sub(r"\s+", "", use_body)
    def go(prefix, s):
        res, depth, start = [], 0, 0
        parts = []
        for k, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(s[start:k])
                start = k + 1
        parts.append(s[start:])
        for p in parts:
            if not p:
                continue
            if "{" in p:
                head, rest = p.split("{", 1)
                res += go(prefix + head, rest[:-1])
            else:
                p = re.sub(r"as[\w$]+$", "", p.replace("::*", ""))
                res.append(prefix + p)
        return res
    return go("", body)


def module_files(src):
    """module path tuple -> file, for the crate rooted at src (lib.rs or main.rs)."""
    mods = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            full = os.path.join(root, f)
            rel = os.path.relpath(full, src)[:-3].split(os.sep)
            if rel in (["lib"], ["main"]):
                mods[()] = full
            elif rel[-1] == "mod":
                mods[tuple(rel[:-1])] = full
            else:
                mods[tuple(rel)] = full
    return mods


def resolve(mods, segments):
    """The file of the deepest module with a file on `segments`."""
    best = mods.get(())
    for k in range(1, len(segments) + 1):
        f = mods.get(tuple(segments[:k]))
        if f is None:
            break
        best = f
    return best


def edges_of(mods, modpath, path):
    text = strip(open(path, encoding="utf-8").read())
    refs = set()
    inline = []  # (module path inside the file, depth at which its block closes)
    depth = 0
    uses = {m.start(): m.group(1) for m in USE.finditer(text)}
    pos = 0
    for line in text.split("\n"):
        m = INLINE_MOD.match(line)
        if m:
            inline.append((m.group(1), depth))
        here = list(modpath) + [name for name, _ in inline]
        candidates = []
        for start, body in uses.items():
            if pos <= start < pos + len(line) + 1:
                candidates += expand(body)
        # a macro's `$crate::a::$m::X` names a module the caller picks: not an import here
        line = re.sub(r"::\$\w+", "::__macro_var__", line)
        candidates += ["".join(x) for x in PATH.findall(line)]
        for c in candidates:
            if "__macro_var__" in c or "$" in c:
                continue
            segs = [s for s in c.split("::") if s]
            if not segs:
                continue
            if segs[0] == "crate":
                target = segs[1:]
            elif segs[0] in ("super", "self"):
                base = list(here)
                while segs and segs[0] in ("super", "self"):
                    if segs[0] == "super":
                        base = base[:-1]
                    segs = segs[1:]
                target = base + segs
            elif tuple(here + segs[:1]) in mods:
                target = here + segs  # a child module, named relative to this one
            else:
                continue
            f = resolve(mods, target)
            if f and f != path:
                refs.add(f)
        depth += line.count("{") - line.count("}")
        while inline and depth <= inline[-1][1]:
            inline.pop()
        pos += len(line) + 1
    return refs


def cycles(src):
    mods = module_files(src)
    graph = {f: edges_of(mods, mp, f) for mp, f in mods.items()}
    found, index, low, stack, on, counter = [], {}, {}, [], set(), [0]
    sys.setrecursionlimit(10000)
    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))
    for v in graph:
        if v not in index:
            strong(v)
    return found, graph


def main():
    dirs = sys.argv[1:] or sorted(
        [os.path.join("crates", c, "src") for c in os.listdir("crates")] + ["loadgen/src"]
    )
    pairs = loops = 0
    for d in dirs:
        found, graph = cycles(d)
        for comp in found:
            mutual = sorted(
                (a, b) for a in comp for b in graph[a] if a < b and a in graph.get(b, ())
            )
            for a, b in mutual:
                pairs += 1
                print(f"import cycle: {a} and {b} import each other")
            if not mutual:
                loops += 1
                print(f"import cycle: files of {d} that import each other around a loop:")
                for f in comp:
                    into = sorted(g for g in graph[f] if g in comp)
                    print(f"  {f} imports {', '.join(into)}")
    if pairs or loops:
        sys.exit(1)
    print(f"import-cycles: no files of one crate import each other ({len(dirs)} crates)")


if __name__ == "__main__":
    main()
