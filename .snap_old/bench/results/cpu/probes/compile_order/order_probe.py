import sys
import ttsaot.builder.build as b
orig = b.largest_first
def spy(items, cost):
    out = orig(items, cost)
    for it in out:
        print("ORDER", f"{it[0].spec.name}/{it[1].label}", cost(it), flush=True)
    return out
b.largest_first = spy
from ttsaot.builder.cli import main
sys.argv = ["build-artifacts", "build", "fish-s2-pro", "--preset", sys.argv[1], "--random-weights", "--device", "cpu", "--jobs", "2",
            "--dynamic-packages", "off", "--batch-buckets", "1", "--frame-buckets", "50", "--out", "/tmp/order_out", "--no-cache", "--no-verify"]
main()
