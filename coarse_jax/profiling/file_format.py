"""A `Profile` as JSON: the format tag, the fields, and the errors of a file that is not one.

`Profile.to_json_dict` / `from_json_dict` / `save` / `load` read and write
it; this module alone knows the format.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from coarse_jax.profiling.links import TIME_FIELDS

FORMAT = "coarse_jax.profile/1"


def to_json(profile: Any) -> dict[str, Any]:
    """``profile``'s fields as plain JSON values (arrays as nested lists), with the tag."""
    out: dict[str, Any] = {
        "format": FORMAT,
        "workers": profile.workers,
        "proxies": profile.proxies,
        "sizes": list(profile.sizes),
        "topology": profile.topology,
        "time_scale": profile.time_scale,
        "host": profile.host,
    }
    for name, _ in TIME_FIELDS:
        out[name] = getattr(profile, name).tolist()
    if profile.wp_spread is not None:
        out["wp_spread"] = profile.wp_spread.tolist()
    if profile.decisions is not None:
        out["decisions"] = [dataclasses.asdict(d) for d in profile.decisions]
    return out


def from_json(data: Any, source: str) -> dict[str, Any]:
    """The `Profile` fields of a decoded ``coarse_jax.profile/1`` object (``source`` names
    its origin in errors); a ValueError when it is not one or misses a field."""
    if not isinstance(data, dict):
        # A file holding the wrong JSON is bad content, like a wrong "format": one error type.
        raise ValueError(
            f'{source}: expected a JSON object with "format": {FORMAT!r}, got a '
            f"{type(data).__name__}; was it written by Profile.save?"
        )
    fmt = data.get("format")
    if fmt != FORMAT:
        raise ValueError(
            f'{source}: expected "format": {FORMAT!r}, got {fmt!r}; write it with '
            "Profile.save (or re-run the profiler with this version of coarse_jax)."
        )
    required = ["workers", "sizes"] + [n for n, _ in TIME_FIELDS]
    missing = [k for k in required if k not in data]
    if missing:
        raise ValueError(
            f"{source}: missing field(s) {missing} of {FORMAT!r}; the file is truncated or "
            "was not written by Profile.save."
        )
    return {
        "workers": data["workers"],
        "sizes": tuple(data["sizes"]),
        **{n: data[n] for n, _ in TIME_FIELDS},
        "topology": data.get("topology"),
        "time_scale": data.get("time_scale", 1.0),
        "host": data.get("host", ""),
        "wp_spread": data.get("wp_spread"),
        "proxies": data.get("proxies", 0),  # absent: an older, 1:1 profile
        "decisions": data.get("decisions"),  # absent: route from the times alone
    }


def parse(text: str, where: str) -> Any:
    """``text`` decoded as JSON, or a ValueError naming ``where`` it came from."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{where}: expected JSON written by Profile.save, got invalid JSON ({e})."
        ) from None
