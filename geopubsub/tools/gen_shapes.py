"""What the two workload generators (``gen``: synthetic, ``gen_places``: real place names)
share: the paper's DNF expression shape and the checks of the options both take."""

from __future__ import annotations

import numpy as np

from shard.errors import ValidationError


def dnf_text(rng: np.random.Generator, terms: list[str]) -> str:
    """Paper Sect. 5.1.1: split the terms in two groups by a random AND/OR between neighbours;
    each group becomes an OR- or AND-clause; groups are joined by AND."""
    cut = int(rng.integers(1, len(terms)))
    groups = [terms[:cut], terms[cut:]]
    parts = []
    for g in groups:
        op = " OR " if rng.random() < 0.5 else " AND "
        parts.append(f"({op.join(g)})" if len(g) > 1 else g[0])
    return " AND ".join(parts)


def check_shapes(
    n_subs: int,
    n_msgs: int,
    *,
    dnf_share: float,
    circle_share: float,
    region_msg_share: float,
    moving_share: float,
    min_area: float,
    max_area: float,
) -> None:
    """ValidationError naming the flag of the first bad count, share or area."""
    for name, v in (("--subs", n_subs), ("--msgs", n_msgs)):
        if v < 0:
            raise ValidationError(name, v, "must be >= 0")
    for name, v in (
        ("--dnf-share", dnf_share),
        ("--circle-share", circle_share),
        ("--region-msg-share", region_msg_share),
        ("--moving-share", moving_share),
    ):
        if not 0.0 <= v <= 1.0:
            raise ValidationError(name, v, "must be in [0, 1]")
    if not 0 < min_area <= max_area <= 1:
        raise ValidationError(
            "--min-area", (min_area, max_area), "need 0 < min-area <= max-area <= 1"
        )
