"""Times lower_for_cpu's two tables on the same exported programs of a tiny CPU build (parent process only)."""
import sys, time

def main():
    import torch
    import ttsaot.builder.export as ex
    from ttsaot.builder.kernels.decompositions import CPU_DECOMPOSITIONS

    def both(ep):
        out = None
        for rep in range(2):
            for name in ("core_aten_table", "ttsaot_ops_only"):
                t = time.perf_counter()
                if name == "core_aten_table":
                    table = torch.export.default_decompositions(); table.update(CPU_DECOMPOSITIONS)
                else:
                    table = dict(CPU_DECOMPOSITIONS)
                r = ep.run_decompositions(table, decompose_custom_triton_ops=True)
                nodes = sum(1 for n in r.graph.nodes if n.op == "call_function")
                print(f"LOWER rep{rep} {name} {time.perf_counter() - t:.2f} s, {nodes} calls", flush=True)
                out = r
        return out

    ex.lower_for_cpu = both
    from ttsaot.builder.cli import main as cli
    sys.argv = ["build-artifacts", "build", sys.argv[1], "--preset", "tiny", "--random-weights", "--device", "cpu",
                "--jobs", "2", "--out", "/tmp/tl_out", "--no-cache", "--no-verify"]
    cli()

if __name__ == "__main__":
    main()
