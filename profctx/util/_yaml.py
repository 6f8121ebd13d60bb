"""YAML loaders for configs: ``yaml.SafeLoader`` bounded against alias bombs, and without base-60 numbers.

An alias names a node defined once, and the loaded data shares it; a few hundred bytes of
aliases of aliases (the "billion laughs") stand for billions of nodes, and whatever walks or
copies the data (OmegaConf, a config check) then never ends. :class:`BoundedSafeLoader`
refuses a document that stands for more than :data:`MAX_NODES` nodes, its aliases counted as
the copies they are; every YAML reader of profctx uses it (``configure()`` through
:class:`SliceSafeLoader`, the verl readers and ``profctx verl-convert`` through :func:`check_aliases`).

YAML 1.1 reads an unquoted ``3:6`` as 3*60 + 6 = 186 and ``1:30.5`` as 90.5. In a profiler
config every such scalar is a step slice (``steps: 3:6``), never a clock reading, so an
untagged one stays a string in :class:`SliceSafeLoader`; one forced with ``!!int`` or ``!!float``
is refused. Imported only when a YAML file is read: PyYAML is an optional dependency.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import yaml

_NUMBER_TAGS: Final = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
_STR_TAG: Final = "tag:yaml.org,2002:str"
#: Nodes a YAML document may stand for, each alias counted as a copy of the node it names (a
#: verl trainer config holds a few thousand).
MAX_NODES: Final = 200_000


class BoundedSafeLoader(yaml.SafeLoader):
    """Load like ``yaml.safe_load``; refuse a document whose aliases expand it past :data:`MAX_NODES` nodes.

    The refusal is a ``yaml.composer.ComposerError`` (a ``yaml.YAMLError``), raised before any
    value is built.
    """

    def compose_document(self) -> Any:
        """Compose the document, then count the nodes it stands for."""
        node = super().compose_document()  # type: ignore[no-untyped-call]
        if node is not None and expanded(node) > MAX_NODES:
            raise yaml.composer.ComposerError(
                None, None, f"the document stands for over {MAX_NODES} nodes through its aliases (an alias bomb?)",
                node.start_mark)
        return node


def expanded(root: yaml.Node) -> int:
    """Return how many nodes ``root`` stands for, a shared node counted at each use (capped past MAX_NODES).

    Each distinct node is walked once (no recursion: a deep document cannot exhaust the stack).
    A node that holds itself (``&a [*a]``) stands for endlessly many: the cap.
    """
    cap = MAX_NODES + 1
    sizes: dict[int, int] = {}
    walking = {id(root)}
    stack: list[tuple[yaml.Node, Iterator[yaml.Node], int]] = [(root, iter(_children(root)), 1)]
    while stack:
        node, children, total = stack[-1]
        for child in children:
            known = sizes.get(id(child))
            if known is None:  # walk it first, then come back for the rest
                if id(child) in walking:
                    return cap
                walking.add(id(child))
                stack[-1] = (node, children, total)
                stack.append((child, iter(_children(child)), 1))
                break
            total = min(total + known, cap)
        else:
            stack.pop()
            walking.discard(id(node))
            sizes[id(node)] = total
            if stack:
                parent, rest, count = stack[-1]
                stack[-1] = (parent, rest, min(count + total, cap))
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def check_aliases(text: str) -> None:
    """Parse YAML ``text`` (no value built) and raise ``yaml.YAMLError`` if it is invalid or an alias bomb.

    For a reader with a loader of its own (OmegaConf's): check first, then let it load.
    """
    loader = BoundedSafeLoader(text)
    try:
        loader.get_single_node()
    finally:
        loader.dispose()  # type: ignore[no-untyped-call]


class SliceSafeLoader(BoundedSafeLoader):
    """Load like ``yaml.safe_load``, except that no number is read from ``a:b`` text."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        """Resolve as YAML 1.1 does, but leave an untagged ``a:b`` scalar a string."""
        tag = super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]
        if kind is yaml.ScalarNode and implicit[0] and tag in _NUMBER_TAGS and ":" in value:
            return _STR_TAG
        return tag


def _refuse_base_60(loader: SliceSafeLoader, node: yaml.Node) -> Any:
    value = loader.construct_scalar(node)  # type: ignore[arg-type]
    if isinstance(value, str) and ":" in value:
        raise yaml.constructor.ConstructorError(
            None, None,
            f"{value!r} tagged {node.tag} would be a YAML 1.1 base-60 number; write the slice as text, e.g. '3:6'",
            node.start_mark,
        )
    if node.tag == _NUMBER_TAGS[0]:
        return yaml.SafeLoader.construct_yaml_int(loader, node)  # type: ignore[arg-type]
    return yaml.SafeLoader.construct_yaml_float(loader, node)  # type: ignore[arg-type]


for _tag in _NUMBER_TAGS:
    SliceSafeLoader.add_constructor(_tag, _refuse_base_60)
