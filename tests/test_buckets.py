import pytest

from ttsaot.builder.buckets import BucketPlan, StreamingConfig, batch_sizes, frame_sizes, powers_of_two


def test_streaming_windows_fish_pattern():
    # Fish: 4-frame first chunks with all history as context until 25, then 25 + 25 context.
    st = StreamingConfig(chunk_frames=25, left_context_frames=25, first_chunk_frames=4, nonstreaming_chunk_frames=0)
    assert st.window_sizes() == [4, 8, 12, 16, 20, 24, 25, 50]


def test_streaming_windows_qwen_defaults():
    st = StreamingConfig(chunk_frames=25, left_context_frames=25, first_chunk_frames=0, nonstreaming_chunk_frames=300)
    assert st.window_sizes() == [25, 50, 325]


def test_frame_sizes_adds_powers_of_two_up_to_largest_window():
    st = StreamingConfig(25, 25, 0, 300)
    assert frame_sizes(st) == (8, 16, 25, 32, 50, 64, 128, 256, 325)
    assert frame_sizes(st, pow2=False) == (25, 50, 325)
    assert frame_sizes(st, explicit=(50, 25, 25)) == (25, 50)


def test_batch_sizes():
    assert batch_sizes(8) == (1, 2, 4, 8)
    assert batch_sizes(6) == (1, 2, 4, 6)  # the admitted maximum is always a bucket
    assert batch_sizes(1) == (1,)
    assert batch_sizes(8, (4, 1)) == (1, 4)
    with pytest.raises(ValueError):
        batch_sizes(0)


def test_plan_cross_product_and_keys():
    plan = BucketPlan({"batch": (1, 4), "frames": (25, 50)})
    assert plan.buckets() == [
        {"batch": 1, "frames": 25},
        {"batch": 1, "frames": 50},
        {"batch": 4, "frames": 25},
        {"batch": 4, "frames": 50},
    ]
    assert BucketPlan.key({"batch": 4, "frames": 50}) == "b4_f50"


def test_powers_of_two():
    assert powers_of_two(20) == [1, 2, 4, 8, 16]
    assert powers_of_two(7, start=2) == [2, 4]


def test_invalid_streaming_config():
    with pytest.raises(ValueError):
        StreamingConfig(chunk_frames=0)
    with pytest.raises(ValueError):
        StreamingConfig(left_context_frames=-1)
