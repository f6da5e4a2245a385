"""`bench run --merge`: a run that measures only some variants/buckets keeps the rest of the stage's result file."""

from bench.__main__ import merge_results


def _res(started, variants, buckets, slug="nvidia-h200"):
    return {
        "started": started,
        "git_commit": started[-1],
        "device": {"slug": slug},
        "variants": variants,
        "buckets": [{"key": k} for k in buckets],
        "floor": {k: {"ms": 1.0} for k in buckets},
        "notes": [],
        "coldstart": {"from": started},
    }


def test_merge_keeps_unmeasured_variants_and_buckets_and_marks_them():
    old = _res(
        "t1",
        {
            "eager": {"buckets": {"b1": {"ms": 9.0}, "b4": {"ms": 12.0}}},
            "ttsaot_graph": {"buckets": {"b1": {"ms": 3.0}}},
        },
        ["b1", "b4"],
    )
    new = _res(
        "t2", {"eager": {"buckets": {"b1": {"ms": 8.0}}}, "compile_graph": {"buckets": {"b1": {"ms": 3.1}}}}, ["b1"]
    )
    del new["coldstart"]
    out = merge_results(old, new)
    assert out["variants"]["eager"]["buckets"]["b1"] == {"ms": 8.0}  # new figure wins
    assert out["variants"]["eager"]["buckets"]["b4"]["merged_from"]["started"] == "t1"
    assert out["variants"]["ttsaot_graph"]["merged_from"]["started"] == "t1"
    assert "merged_from" not in out["variants"]["compile_graph"]
    assert [b["key"] for b in out["buckets"]] == ["b1", "b4"] and set(out["floor"]) == {"b1", "b4"}
    # an unmeasured section, named as the old run's
    assert out["coldstart"] == {"from": "t1", "merged_from": {"started": "t1", "git_commit": "1"}}
    assert any("merged" in n for n in out["notes"])


def test_merge_unions_the_stage_axes_the_report_header_names():
    old = _res("t1", {"eager": {"buckets": {"b1": {"ms": 9.0}, "b16": {"ms": 12.0}}}}, ["b1", "b16"])
    new = _res("t2", {"compile_graph": {"buckets": {"b1": {"ms": 3.1}}}}, ["b1"])
    old["stage"] = {"stage": "s", "axes": {"batch": [1, 16]}}
    new["stage"] = {"stage": "s", "axes": {"batch": [1]}, "kernels": "auto"}
    out = merge_results(old, new)
    assert out["stage"] == {"stage": "s", "axes": {"batch": [1, 16]}, "kernels": "auto"}


def test_merge_never_mixes_devices():
    old = _res("t1", {"ttsaot_graph": {"buckets": {"b1": {"ms": 3.0}}}}, ["b1"], slug="nvidia-h100")
    new = _res("t2", {"eager": {"buckets": {"b1": {"ms": 8.0}}}}, ["b1"])
    assert merge_results(old, new) == new
