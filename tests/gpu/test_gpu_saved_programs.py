"""The hand-over of a CUDA stage's programs to the compile workers (builder/saved_programs.py): the archives carry
CPU stand-ins inside a CUDA program, the tensors file holds the CUDA tensors once, and a worker gets the program
back on the GPU and compiles it to a package that computes what the module does."""

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from ttsaot.builder.parallel_compile import CompileTask, compile_in_workers  # noqa: E402
from ttsaot.builder.saved_programs import StageTensors, save_program  # noqa: E402


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(256, 1024)

    def forward(self, x):
        return torch.relu(self.proj(x))


@pytest.mark.compiles(28)
def test_cuda_programs_round_trip_through_the_workers(tmp_path):
    net = _Net().cuda().eval()
    inputs = [torch.randn(rows, 256, device="cuda") for rows in (2, 5)]
    eps = [torch.export.export(net, (x,)) for x in inputs]
    shared = StageTensors()
    names = [shared.add(ep) for ep in eps]
    assert len(shared.entries) == 2  # weight and bias, once for both programs
    shared.write(tmp_path / "tensors.pt")
    tasks = []
    for i, (ep, x) in enumerate(zip(eps, inputs)):
        save_program(ep, tmp_path / f"p{i}.pt2", names[i])
        assert (tmp_path / f"p{i}.pt2").stat().st_size < 256 * 1024 * 4  # the CUDA weight stayed out of it
        assert ep.state_dict["proj.weight"].is_cuda  # the caller's program is left whole
        tasks.append(
            CompileTask(
                f"net/{i}",
                tmp_path / f"p{i}.pt2",
                (x,),
                torch.device("cuda"),
                tmp_path / f"pkg{i}.pt2",
                f"net_{i}",
                {},
                None,
                tensors=tmp_path / "tensors.pt",
                tensor_names=names[i],
            )
        )
    done: dict[str, dict] = {}
    compile_in_workers(tasks, 2, lambda task, weights: done.setdefault(task.label, weights))
    assert sorted(done) == ["net/0", "net/1"]
    for i, x in enumerate(inputs):
        pkg = torch._inductor.aoti_load_package(str(tmp_path / f"pkg{i}.pt2"))
        # the workers hand the weights back on the host (the builder writes them to the stage's weights file)
        weights = {name: t.cuda() for name, t in done[f"net/{i}"].items()}
        pkg.load_constants(weights, check_full_update=True, user_managed=True)
        with torch.no_grad():
            torch.testing.assert_close(pkg(x), net(x), rtol=1e-4, atol=1e-4)
