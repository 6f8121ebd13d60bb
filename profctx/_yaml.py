"""A YAML loader for configs: ``yaml.SafeLoader`` without YAML 1.1's base-60 numbers.

YAML 1.1 reads an unquoted ``3:6`` as 3*60 + 6 = 186 and ``1:30.5`` as 90.5. In a profiler
config every such scalar is a step slice (``steps: 3:6``), never a clock reading, so an
untagged one stays a string here; one forced with ``!!int`` or ``!!float`` is refused.
Imported only when a YAML file is read: PyYAML is an optional dependency.
"""

from __future__ import annotations

from typing import Any, Final

import yaml

_NUMBER_TAGS: Final = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
_STR_TAG: Final = "tag:yaml.org,2002:str"


class SliceSafeLoader(yaml.SafeLoader):
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
