"""YAML read safely and within bounds: ``yaml.SafeLoader`` that refuses deep nesting, alias bombs and huge
integers with the line, in bounded time and memory."""

from __future__ import annotations

from typing import Any

import yaml

MAX_YAML_DEPTH = 64  # nesting levels (a tune space has 4); Python's recursion would end much deeper in a traceback
MAX_YAML_NODES = 10_000  # nodes once aliases are expanded (a tune space has a few hundred): no "billion laughs"
MAX_YAML_INT = 40  # characters of a YAML integer (int() of 4,300 digits raises ValueError, not a YAML error)


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses nesting deeper than :data:`MAX_YAML_DEPTH` and a document whose aliases
    expand beyond :data:`MAX_YAML_NODES` nodes, with the line, in bounded time and memory."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", self.peek_event().start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node: Any) -> Any:
        _measure(node, 1, {}, set())
        return super().construct_document(node)

    def construct_yaml_int(self, node: Any) -> Any:
        if len(node.value) > MAX_YAML_INT:
            too_long = f"an integer of {len(node.value):,} characters, expected at most {MAX_YAML_INT}"
            raise yaml.constructor.ConstructorError(None, None, too_long, node.start_mark)
        return super().construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def _measure(n: Any, depth: int, done: dict[int, tuple[int, int]], open_: set[int]) -> tuple[int, int]:
    """(nodes, height) of the tree that ``n``'s aliases make (a node reached twice counts twice), refused past
    :data:`MAX_YAML_NODES` nodes or :data:`MAX_YAML_DEPTH` levels — aliases of aliases nest deeper than the text
    does — or when an alias refers to a node that holds it (``&a [*a]``: a tree without end). Recurses at most
    :data:`MAX_YAML_DEPTH` deep."""
    if id(n) not in done:
        if id(n) in open_:
            raise yaml.composer.ComposerError(None, None, "an alias refers to a node that holds it", n.start_mark)
        if depth > MAX_YAML_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"aliases nest deeper than {MAX_YAML_DEPTH} levels", n.start_mark
            )
        kids = (
            [c for pair in n.value for c in pair]
            if isinstance(n, yaml.MappingNode)
            else (n.value if isinstance(n, yaml.SequenceNode) else [])
        )
        open_.add(id(n))
        parts = [_measure(c, depth + 1, done, open_) for c in kids]
        open_.discard(id(n))
        done[id(n)] = (1 + sum(p[0] for p in parts), 1 + max((p[1] for p in parts), default=0))
    nodes, height = done[id(n)]
    if nodes > MAX_YAML_NODES:
        raise yaml.composer.ComposerError(
            None, None, f"aliases expand to more than {MAX_YAML_NODES} nodes", n.start_mark
        )
    if depth + height - 1 > MAX_YAML_DEPTH:
        raise yaml.composer.ComposerError(
            None, None, f"aliases nest deeper than {MAX_YAML_DEPTH} levels", n.start_mark
        )
    return nodes, height


def safe_yaml(text: str) -> Any:
    """``yaml.safe_load`` bounded in depth and alias expansion (:class:`_BoundedLoader`)."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
