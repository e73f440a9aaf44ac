#!/usr/bin/env python3
"""The include structure of include/replay/, checked or drawn.

  include_layout.py [--root DIR]          check the layout rules; prints each
                                          breach and exits 1 if there is one
  include_layout.py --dot [--root DIR]    the include graph in Graphviz DOT, one
                                          cluster per component (core, detail,
                                          and each component folder)

The rules (docs/DEVELOPING.md, "Layout"):
  1. A header in replay/detail/ (what two or more components share) includes
     no component's header: nothing from replay/<component>/ or
     replay/<component>.hpp. Core headers (replay/*.hpp that are no umbrella)
     are allowed: they are the floor the components stand on.
  2. No header of a component (public, umbrella or detail/) includes another
     component's detail/: what one component needs of another is that
     component's public API.
  3. No core header includes a component's header (the core stands alone);
     replay/replay.hpp, the umbrella, is the one exception.
  4. Every header in a component's detail/ is included by that component (a
     header left behind after its users moved is dead).
  5. No header is over 450 physical lines (split it along concept lines).
  6. No header outside an optional component (decode, torch, nccl, audit: own
     CMake targets, never in replay/replay.hpp) includes one of its headers;
     replay/replay.hpp is no exception. An optional component may build on
     the core and on the other components.
A component is a folder of include/replay/ other than detail/ (graph_builder,
shape_router, stream_pipeline, batcher, torch, nccl, ...), together with its
umbrella header, the one of the same name (replay/graph.hpp, the core's Graph,
is no component's).
"""
import argparse
import pathlib
import re
import sys

MAX_LINES = 450
# The components with CMake targets of their own (replay::decode, ...), which
# only their users include.
OPTIONAL = ("audit", "decode", "nccl", "torch")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](replay/[^>"]+)[>"]', re.M)


def component_of(header, components):
    """'core', 'detail', or the component's name, for a path like replay/x/y.hpp."""
    parts = header.split("/")
    if len(parts) >= 3 and parts[1] in components:
        return parts[1]
    if len(parts) >= 3 and parts[1] == "detail":
        return "detail"
    stem = parts[-1][: -len(".hpp")] if parts[-1].endswith(".hpp") else parts[-1]
    if len(parts) == 2 and stem in components:
        return stem  # the component's umbrella
    return "core"


def is_component_internal(header, components):
    parts = header.split("/")
    return len(parts) >= 4 and parts[1] in components and parts[2] == "detail"


def load(root):
    base = pathlib.Path(root)
    headers = sorted(p for p in (base / "replay").rglob("*.hpp"))
    components = sorted(p.name for p in (base / "replay").iterdir() if p.is_dir() and p.name != "detail")
    graph = {}
    lines = {}
    for path in headers:
        name = path.relative_to(base).as_posix()
        text = path.read_text()
        graph[name] = INCLUDE.findall(text)
        lines[name] = len(text.splitlines())
    return graph, components, lines


def breaches(graph, components, lines=None):
    found = []
    for header, includes in graph.items():
        where = component_of(header, components)
        for target in includes:
            if target not in graph:
                found.append(f"{header}: includes {target}, which does not exist")
                continue
            to = component_of(target, components)
            if where == "detail" and to not in ("core", "detail"):
                found.append(f"{header}: a shared internal includes the component header {target} (rule 1)")
            if where not in ("core", "detail") and is_component_internal(target, components) and to != where:
                found.append(f"{header}: includes another component's internal {target} (rule 2)")
            if where == "core" and header != "replay/replay.hpp" and to not in ("core", "detail"):
                found.append(f"{header}: a core header includes the component header {target} (rule 3)")
            if to in OPTIONAL and to != where:
                found.append(f"{header}: includes {target} of the optional component {to} (rule 6)")
    for header in graph:
        if not is_component_internal(header, components):
            continue
        owner = component_of(header, components)
        if not any(header in includes and component_of(user, components) == owner
                   for user, includes in graph.items() if user != header):
            found.append(f"{header}: no header of {owner} includes it (rule 4)")
    for header, count in sorted((lines or {}).items()):
        if count > MAX_LINES:
            found.append(f"{header}: {count} lines, over the limit of {MAX_LINES} (rule 5)")
    return found


def dot(graph, components):
    lines = ["digraph replay_includes {", "  rankdir=BT;", "  node [shape=box, fontsize=9];"]
    groups = {}
    for header in graph:
        groups.setdefault(component_of(header, components), []).append(header)
    for group, members in sorted(groups.items()):
        lines.append(f'  subgraph "cluster_{group}" {{ label="{group}";')
        lines += [f'    "{m}";' for m in members]
        lines.append("  }")
    for header, includes in sorted(graph.items()):
        for target in includes:
            if target in graph and target != "replay/detail/require_cxx20.hpp":
                lines.append(f'  "{header}" -> "{target}";')
    lines.append("}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parent.parent / "include"))
    parser.add_argument("--dot", action="store_true", help="print the include graph in DOT instead of checking")
    args = parser.parse_args()
    graph, components, lines = load(args.root)
    if args.dot:
        print(dot(graph, components))
        return 0
    found = breaches(graph, components, lines)
    for line in found:
        print(line)
    print(f"include layout: {len(graph)} headers, components {', '.join(components)}: "
          f"{'OK' if not found else f'{len(found)} breaches'}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
