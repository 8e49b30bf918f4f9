"""The tensor engine on two real worker processes (spawned once for the module), checked against
plain torch on the client."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import monarch
import monarch.tensor._mesh
from monarch.actor import ProcMesh, this_host
from monarch.config import configured
from monarch.tensor import (
    RemoteException,
    Stream,
    Tensor,
    call_on_shard_and_fetch,
    coalescing,
    fetch_shard,
    get_active_mesh,
    get_active_stream,
    grad_generator,
    inspect,
    no_mesh,
    reduce,
    remote,
    slice_mesh,
    to_mesh,
)
from monarch.tensor._table import Failure
from monarch.tensor._worker import MAX_LOGGED_FAILURES, TensorWorker

sys.path.insert(0, str(Path(__file__).parent))  # workers import tensor_helpers by name
from tensor_helpers import (
    Scaler,
    data_dependent,
    expected_shard,
    explode,
    pair,
    raise_flag,
    shard_data,
    slow_fill,
    wait_for_flag,
)

T = 60.0
N = 2


@pytest.fixture(scope="module", params=["lanes", "force-quic"])
def procs(request: pytest.FixtureRequest) -> Iterator[ProcMesh]:
    """Two worker processes shared by the module's tests; once over direct lanes, once with
    every message on QUIC (the engine's order must hold on both)."""
    with configured(force_quic=request.param == "force-quic"):
        mesh = this_host().spawn_procs(per_host={"gpus": N})
        try:
            yield mesh
        finally:
            mesh.stop().get(timeout=T)


@pytest.fixture
def active(procs: ProcMesh) -> Iterator[Any]:
    with procs.activate() as mesh:  # type: ignore[attr-defined,unused-ignore]
        yield mesh


shard = remote(shard_data, propagate=lambda like: torch.empty_like(like))


def dist(t: torch.Tensor) -> Tensor:
    """``t``, a distributed tensor (typed as such)."""
    assert isinstance(t, Tensor)
    return t


def shards(shape: tuple[int, ...]) -> Tensor:
    """A distributed tensor whose shard on rank r is ``expected_shard(r, shape)``."""
    out = shard(torch.zeros(shape))
    assert isinstance(out, Tensor)
    return out


def local(rank: int, shape: tuple[int, ...]) -> torch.Tensor:
    with no_mesh.activate():
        return expected_shard(rank, shape)


def close(t: Any, expected: Callable[[], torch.Tensor], **coords: int) -> bool:
    """The shard of ``t`` at ``coords`` equals ``expected()`` (made locally)."""
    value = fetch_shard(t, None, **coords).get(timeout=T)
    with no_mesh.activate():
        want = expected()
        return value.shape == want.shape and bool(torch.allclose(value, want))


def test_ops_produce_distributed_tensors_with_propagated_shapes(active: Any) -> None:
    a = torch.ones(2, 3)
    b = dist((a * 2 + 1).to(torch.float64))
    assert b.mesh == active == get_active_mesh()
    assert b.shape == (2, 3)
    assert b.dtype == torch.float64
    for rank in range(N):
        assert close(b, lambda: torch.full((2, 3), 3.0, dtype=torch.float64), gpus=rank)
    value = inspect(b)
    with no_mesh.activate():
        assert torch.equal(value, torch.full((2, 3), 3.0, dtype=torch.float64))


def test_matmul_and_elementwise_match_plain_torch(active: Any) -> None:
    x = shards((3, 4))
    with no_mesh.activate():
        w = torch.arange(8.0).reshape(4, 2)  # local data, sent with the op
    y = torch.relu(x @ w - 20).sum(dim=1, keepdim=True)
    assert y.shape == (3, 1)
    for rank in range(N):
        with no_mesh.activate():
            expected = torch.relu(local(rank, (3, 4)) @ torch.arange(8.0).reshape(4, 2) - 20).sum(
                dim=1, keepdim=True
            )
        assert close(y, lambda e=expected: e, gpus=rank)  # type: ignore[misc]


def test_shape_errors_are_raised_on_the_client_at_once(active: Any) -> None:
    with pytest.raises(RuntimeError, match="same reduction dim"):
        torch.ones(2, 3) @ torch.ones(2, 2)


def test_item_asks_for_a_fetch(active: Any) -> None:
    with pytest.raises(RuntimeError, match="fetch_shard"):
        torch.ones(1).item()


@pytest.mark.parametrize("reduction", ["sum", "avg", "max", "min"])
def test_reduce_over_the_mesh_matches_the_shards(active: Any, reduction: str) -> None:
    x = shards((4, 2))
    r = x.reduce("gpus", reduction)  # type: ignore[arg-type]
    with no_mesh.activate():
        stacked = torch.stack([local(rank, (4, 2)) for rank in range(N)])
        expected = {
            "sum": stacked.sum(0),
            "avg": stacked.mean(0),
            "max": stacked.max(0).values,
            "min": stacked.min(0).values,
        }[reduction]
    for rank in range(N):
        assert close(r, lambda: expected, gpus=rank)


def test_reduce_scatter_stack_and_all_to_all(active: Any) -> None:
    x = shards((4, 2))
    scattered = x.reduce("gpus", "sum", scatter=True)
    stacked = x.reduce("gpus", "stack")
    swapped = reduce(x, "gpus", "stack", scatter=True)
    assert scattered.shape == (2, 2)
    assert stacked.shape == (N, 4, 2)
    assert swapped.shape == (4, 2)
    with no_mesh.activate():
        parts = [local(rank, (4, 2)) for rank in range(N)]
        total = parts[0] + parts[1]
    for rank in range(N):
        assert close(scattered, lambda r=rank: total.chunk(N)[r], gpus=rank)  # type: ignore[misc]
        assert close(stacked, lambda: torch.stack(parts), gpus=rank)
        assert close(swapped, lambda r=rank: torch.cat([p.chunk(N)[r] for p in parts]), gpus=rank)  # type: ignore[misc]


def test_reduce_in_place(active: Any) -> None:
    x = shards((2,))
    same = x.reduce_("gpus", "sum")
    assert same is x
    with no_mesh.activate():
        expected = local(0, (2,)) + local(1, (2,))
    assert close(x, lambda: expected, gpus=1)


def test_reduce_onto_one_process(active: Any) -> None:
    x = shards((3,))
    first = active.slice(gpus=0)
    total = x.reduce("gpus", "sum", mesh=first)
    gathered = x.reduce("gpus", "stack", mesh=first)
    assert total.mesh == first
    assert gathered.shape == (N, 3)
    assert close(total, lambda: local(0, (3,)) + local(1, (3,)))
    assert close(gathered, lambda: torch.stack([local(0, (3,)), local(1, (3,))]))
    with pytest.raises(ValueError, match="mesh= is not allowed"):
        x.reduce_("gpus", "sum", mesh=first)


def test_mesh_rank_is_each_process_coordinate(active: Any) -> None:
    rank = active.rank("gpus")
    assert rank.shape == ()
    assert rank.dtype == torch.long
    assert active.size("gpus") == N
    scaled = torch.ones(2) * (rank + 1)
    for r in range(N):
        assert close(scaled, lambda v=r: torch.full((2,), float(v + 1)), gpus=r)  # type: ignore[misc]
    assert close(active.slice(gpus=slice(1, 2)).rank("gpus"), lambda: torch.tensor(0))
    with pytest.raises(KeyError, match="hosts"):
        active.rank("hosts")


def test_reduce_rejects_bad_arguments(active: Any) -> None:
    x = dist(torch.ones(3))
    with pytest.raises(ValueError, match="dims"):
        x.reduce("hosts", "sum")
    with pytest.raises(ValueError, match="reduction"):
        x.reduce("gpus", "prod")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="divisible"):
        x.reduce("gpus", "sum", scatter=True)


def test_remote_functions_by_value_and_by_path(active: Any) -> None:
    x = shards((2, 2))
    plus, total = remote(pair)(x)
    relu = remote("torch.nn.functional.relu")(x - 5)
    for rank in range(N):
        with no_mesh.activate():
            data = local(rank, (2, 2))
        assert close(plus, lambda d=data: d + 1, gpus=rank)  # type: ignore[misc]
        assert close(total, lambda d=data: d.sum(), gpus=rank)  # type: ignore[misc]
        assert close(relu, lambda d=data: torch.relu(d - 5), gpus=rank)  # type: ignore[misc]


def test_call_on_shard_and_fetch_returns_what_the_function_returns(active: Any) -> None:
    x = shards((2, 2))
    x.add_(1)  # issued before: the call sees it
    got = call_on_shard_and_fetch(remote(pair), x, shard={"gpus": 1}).get(timeout=T)
    with no_mesh.activate():
        data = local(1, (2, 2)) + 1
        assert torch.equal(got[0], data + 1)
        assert torch.equal(got[1], data.sum())
    assert call_on_shard_and_fetch(remote("builtins.len"), x).get(timeout=T) == 2
    with pytest.raises(RemoteException, match="exploded on purpose"):
        call_on_shard_and_fetch(remote(explode), x).get(timeout=T)


def test_a_failed_op_surfaces_at_fetch_and_poisons_what_depends_on_it(active: Any) -> None:
    bad = remote(explode, propagate=lambda x: x)(torch.ones(2))
    later = (bad + 1) * 2
    fine = torch.ones(2) + 1
    for t in (bad, later):
        with pytest.raises(RemoteException, match="exploded on purpose") as info:
            fetch_shard(t, gpus=0).get(timeout=T)
        assert "explode" in info.value.op
        assert "test_engine.py" in info.value.issued_at
    assert close(fine, lambda: torch.full((2,), 2.0), gpus=1)


def failed(mesh: Any) -> list[int]:
    mesh.client.flush()
    return list(mesh.workers.failed.call().get(timeout=T).values())


def test_each_worker_counts_and_logs_the_failed_op_not_what_depends_on_it(active: Any) -> None:
    before = failed(active)
    bad = remote(explode, propagate=lambda x: x)(torch.ones(2))
    later = (bad + 1) * 2
    assert failed(active) == [n + 1 for n in before]
    del bad, later


def test_a_failure_log_names_the_op_where_it_was_issued_and_the_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = object.__new__(TensorWorker)  # no actor context: the logging part only
    worker.rank, worker.failures = 3, 0
    failure = Failure("aten::mm", "prog.py:7 in main", "Traceback...\nRuntimeError: bad\n", 3)
    with caplog.at_level("WARNING", logger="monarch.tensor.worker"):
        for _ in range(MAX_LOGGED_FAILURES + 5):
            worker._note_failure(failure)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == MAX_LOGGED_FAILURES
    assert messages[0] == (
        "tensor worker rank 3: aten::mm issued at prog.py:7 in main failed: RuntimeError: bad"
    )
    assert messages[-1].endswith("(later failures are not logged)")
    assert worker.failures == MAX_LOGGED_FAILURES + 5


def test_commands_run_in_order_across_batches(active: Any) -> None:
    x = torch.zeros(1)
    for _ in range(1300):  # more than two batches
        x.add_(1)
    assert close(x, lambda: torch.tensor([1300.0]), gpus=1)


def live(mesh: Any) -> list[int]:
    mesh.client.flush()
    return list(mesh.workers.live.call().get(timeout=T).values())


def test_dropping_client_tensors_frees_the_shards(active: Any) -> None:
    before = live(active)
    kept = [torch.ones(4) * i for i in range(20)]
    assert all(n >= b + 20 for n, b in zip(live(active), before, strict=True))
    del kept
    assert live(active) == before


def test_no_mesh_runs_locally_inside_activate(active: Any) -> None:
    with no_mesh.activate():
        assert get_active_mesh() is None
        t = torch.ones(2) + 1
        assert type(t) is torch.Tensor
        assert torch.equal(t, torch.full((2,), 2.0))


def test_slice_mesh_and_to_mesh(active: Any) -> None:
    x = shards((2,))
    first = slice_mesh(x, gpus=0)
    assert first.mesh.names == ()
    assert len(first.mesh) == 1
    doubled = first * 2  # runs on rank 0 only
    moved = to_mesh(doubled, active.slice(gpus=1))
    assert close(moved, lambda: local(0, (2,)) * 2)
    with pytest.raises(ValueError, match="different meshes"):
        first + slice_mesh(x, gpus=1)


def test_streams_need_borrows(active: Any) -> None:
    other = Stream("other")
    x = dist(torch.ones(2))
    assert x.stream is get_active_stream()
    with other.activate():
        with pytest.raises(RuntimeError, match="borrow"):
            x + 1
        borrowed, borrow = other.borrow(x)
        y = borrowed + 1
    borrow.drop()
    with other.activate():
        assert close(y, lambda: torch.full((2,), 2.0), gpus=0)
        with pytest.raises(RuntimeError, match="dropped"):
            borrowed + 1
    z = dist(torch.zeros(2))
    with other.activate():
        lent, mutable = other.borrow(z, mutable=True)
        lent.add_(1)
    with pytest.raises(RuntimeError, match="lent mutably"):
        z + 1
    mutable.drop()
    assert close(z, lambda: torch.ones(2), gpus=1)


def test_top_level_names(active: Any) -> None:
    assert monarch.fetch_shard is fetch_shard
    assert monarch.remote is remote
    assert monarch.Tensor is Tensor
    assert monarch.grad_generator is grad_generator


def test_rref_endpoints_return_distributed_tensors(procs: ProcMesh, active: Any) -> None:
    scalers = procs.spawn("scaler", Scaler)
    x = shards((2,))
    y = dist(scalers.scale.rref(x))
    lower, total = scalers.halves.rref(y + 1)
    assert y.shape == (2,)
    assert total.shape == ()
    for rank in range(N):
        assert close(y, lambda r=rank: local(r, (2,)) * 3 + r, gpus=rank)  # type: ignore[misc]
        assert close(lower, lambda r=rank: local(r, (2,)) * 3 + r, gpus=rank)  # type: ignore[misc]
        assert close(total, lambda r=rank: (local(r, (2,)) * 3 + r + 1).sum(), gpus=rank)  # type: ignore[misc]
    assert list(scalers.calls.call().get(timeout=T).values()) == [1] * N
    refused = scalers.fail.rref(x) * 2
    with pytest.raises(RemoteException, match="the actor refused") as info:
        fetch_shard(refused, gpus=1).get(timeout=T)
    assert info.value.op == "fail.rref"
    with pytest.raises(
        NotImplementedError, match="Cached propagation is not implemented for actor endpoints"
    ):
        scalers.no_propagate.rref(x)  # the reference's default propagator, "cached"
    assert scalers.inspected.rref(x) is None  # runs on every process, nothing comes back
    fetch_shard(x + 1).get(timeout=T)  # after the rref call in order
    assert list(scalers.calls.call().get(timeout=T).values()) == [2] * N
    with pytest.raises(NotImplementedError, match="mocked propagation"):
        scalers.mocked.rref(x)
    with pytest.raises(TypeError, match="'str' object is not callable"):
        scalers.bogus.rref(x)


def test_data_parallel_training_matches_plain_torch(active: Any) -> None:
    """Each process its own batch; gradients averaged over the mesh; the same steps replayed
    with plain torch on the client give the same weights and losses."""
    xs = shards((4, 3)) * 0.1
    ys = shards((4, 1)) * 0.05
    w = torch.zeros(3, 1, requires_grad=True)
    losses = []
    for _ in range(3):
        loss = ((xs @ w - ys) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            w -= 0.5 * w.grad.reduce("gpus", "avg")
        w.grad = None
        losses.append(loss)
    with no_mesh.activate():
        data = [(local(r, (4, 3)) * 0.1, local(r, (4, 1)) * 0.05) for r in range(N)]
        w_local = torch.zeros(3, 1)
        expected_losses: list[list[torch.Tensor]] = [[] for _ in range(N)]
        for _ in range(3):
            grads = []
            for rank, (x, y) in enumerate(data):
                w_r = w_local.clone().requires_grad_()
                loss_r = ((x @ w_r - y) ** 2).mean()
                loss_r.backward()
                assert w_r.grad is not None
                grads.append(w_r.grad)
                expected_losses[rank].append(loss_r.detach())
            w_local = w_local - 0.5 * torch.stack(grads).mean(0)
    for rank in range(N):
        assert close(w, lambda: w_local, gpus=rank)
        for step, loss in enumerate(losses):
            assert close(loss, lambda r=rank, s=step: expected_losses[r][s], gpus=rank)  # type: ignore[misc]


@pytest.mark.parametrize("foreach", [False, True])
def test_a_torch_optimizer_steps_on_the_shards(active: Any, foreach: bool) -> None:
    """``torch.optim.SGD.step`` (momentum, both loop kinds) runs on every shard; its profiler
    ranges (``record_function``) stay on the client."""
    xs = shards((4, 3))
    model = torch.nn.Linear(3, 1)
    with torch.no_grad():
        model.weight.fill_(0.5)
        model.bias.fill_(-0.25)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=foreach)
    for _ in range(2):
        model(xs).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    with no_mesh.activate():
        want = []
        for rank in range(N):
            ref = torch.nn.Linear(3, 1)
            with torch.no_grad():
                ref.weight.fill_(0.5)
                ref.bias.fill_(-0.25)
            ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
            for _ in range(2):
                ref(local(rank, (4, 3))).pow(2).mean().backward()
                ref_opt.step()
                ref_opt.zero_grad()
            want.append(ref.weight.detach().clone())
    for rank in range(N):
        assert close(model.weight, lambda r=rank: want[r], gpus=rank)  # type: ignore[misc]


def test_grad_generator_yields_each_gradient_in_order(active: Any) -> None:
    """``grad_generator(loss, [b, w, unused])`` hands out d loss / d b, d loss / d w and None,
    in that order, equal to plain torch's on each shard; the first can be reduced at once."""
    xs = shards((4, 3))
    w = torch.full((3, 1), 0.5, requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    unused = torch.ones(2, requires_grad=True)
    loss = ((xs @ w + b) ** 2).sum()
    grads = grad_generator(loss, [b, w, unused])
    first = next(grads)
    assert isinstance(first, Tensor)
    total = first.reduce("gpus", "sum")
    rest = list(grads)
    assert len(rest) == 2
    assert rest[1] is None
    with no_mesh.activate():
        want = []
        for rank in range(N):
            w_r = torch.full((3, 1), 0.5, requires_grad=True)
            b_r = torch.zeros(1, requires_grad=True)
            ((local(rank, (4, 3)) @ w_r + b_r) ** 2).sum().backward()
            assert w_r.grad is not None
            assert b_r.grad is not None
            want.append((b_r.grad.clone(), w_r.grad.clone()))
        want_total = want[0][0] + want[1][0]
    for rank in range(N):
        assert close(first, lambda r=rank: want[r][0], gpus=rank)  # type: ignore[misc]
        assert close(rest[0], lambda r=rank: want[r][1], gpus=rank)  # type: ignore[misc]
        assert close(total, lambda: want_total, gpus=rank)
    with pytest.raises(ValueError, match="at least one root"):
        grad_generator((), [w])


def test_propagate_cached_runs_once_on_the_first_process_per_input(active: Any) -> None:
    counted = remote("tensor_helpers.calls_of", propagate="inspect")
    before = [
        call_on_shard_and_fetch(counted, "data_dependent", shard={"gpus": g}).get(timeout=T)
        for g in (0, 1)
    ]
    f = remote(data_dependent, propagate="cached")
    x = torch.ones(3) * 2  # each shard sums to 6
    first, label = f(x)
    again, label2 = f(x)  # the same input shape: no second run for shapes
    assert dist(first).shape == (6,)
    assert first.dtype == torch.int32
    assert label == label2 == "rank 0"  # non-tensor outputs come from the first process
    after = [
        call_on_shard_and_fetch(counted, "data_dependent", shard={"gpus": g}).get(timeout=T)
        for g in (0, 1)
    ]
    assert after[0] - before[0] == 3  # the propagation run, then both calls
    assert after[1] - before[1] == 2
    assert close(again, lambda: torch.arange(6, dtype=torch.int32), gpus=1)
    other, _ = f(torch.ones(2))  # a new input shape: propagated again
    assert dist(other).shape == (2,)
    with pytest.raises(RuntimeError, match='propagate="cached"'):
        remote(data_dependent)(x)  # no propagator: runs on meta tensors and cannot


def test_propagate_cached_failure_is_raised_at_the_call(active: Any) -> None:
    with pytest.raises(RemoteException, match="exploded on purpose"):
        remote(explode, propagate="cached")(torch.ones(2))


def test_propagate_inspect_keeps_nothing_and_mocked_or_unknown_fail_as_the_reference(
    active: Any,
) -> None:
    x = torch.ones(2)
    counted = remote("tensor_helpers.calls_of", propagate="inspect")
    before = call_on_shard_and_fetch(counted, "data_dependent", shard={"gpus": 1}).get(timeout=T)
    assert remote(data_dependent, propagate="inspect")(x) is None  # still runs everywhere
    after = call_on_shard_and_fetch(counted, "data_dependent", shard={"gpus": 1}).get(timeout=T)
    assert after == before + 1
    assert call_on_shard_and_fetch(remote("torch.neg", propagate="inspect"), x).get(
        timeout=T
    ).tolist() == [-1.0, -1.0]
    for propagate, error, text in (
        ("mocked", NotImplementedError, "mocked propagation"),
        ("bogus", TypeError, "'str' object is not callable"),
        (3, TypeError, "'int' object is not callable"),
    ):
        with pytest.raises(error, match=text):
            remote("torch.neg", propagate=propagate)(x)
        with pytest.raises(error, match=text):
            call_on_shard_and_fetch(remote("torch.neg", propagate=propagate), x)


def test_streams_overlap_on_the_workers(active: Any) -> None:
    other = Stream("overlap")
    x = torch.zeros(2)
    with other.activate():
        waited = remote(wait_for_flag, propagate=lambda x: x)(torch.zeros(2))  # blocks its stream
    remote(raise_flag, propagate=lambda x: x)(x)  # main, issued later: runs meanwhile
    for rank in range(N):  # one order for all streams would wait 20 s and leave zeros
        assert close(waited, lambda: torch.ones(2), gpus=rank)


def test_a_borrow_waits_for_the_lenders_work(active: Any) -> None:
    other = Stream("borrower")
    filled = remote(slow_fill, propagate=lambda x, v: x)(torch.zeros(3), 5.0)  # 0.3 s on main
    with other.activate():
        borrowed, borrow = other.borrow(filled)
        doubled = borrowed * 2  # on the other stream: after the fill
    borrow.drop()
    borrow.drop()  # again: nothing
    for rank in range(N):
        assert close(doubled, lambda: torch.full((3,), 10.0), gpus=rank)


def test_a_drop_makes_the_lenders_later_work_wait_for_the_borrower(active: Any) -> None:
    other = Stream("mutator")
    z = dist(torch.zeros(3))
    with other.activate():
        lent, borrow = other.borrow(z, mutable=True)
        remote(slow_fill, propagate=lambda x, v: x)(lent, 7.0)  # 0.3 s, writes z's storage
    borrow.drop()
    after = z + 1  # main, after the drop: sees the borrower's write
    for rank in range(N):
        assert close(after, lambda: torch.full((3,), 8.0), gpus=rank)


def test_collectives_of_different_streams_run_in_issued_order(active: Any) -> None:
    other = Stream("collective")
    results = []
    for i in range(4):
        with other.activate():
            results.append(dist(torch.ones(2) * i).reduce("gpus", "sum"))
        results.append(dist(torch.ones(2) * (10 + i)).reduce("gpus", "sum"))
    for rank in range(N):
        got = [fetch_shard(r, gpus=rank).get(timeout=T) for r in results]
        with no_mesh.activate():
            want = [torch.full((2,), 2.0 * v) for i in range(4) for v in (i, 10 + i)]
            assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_to_mesh_onto_another_stream_waits_for_the_source(active: Any) -> None:
    other = Stream("destination")
    filled = remote(slow_fill, propagate=lambda x, v: x)(torch.zeros(2), 3.0)
    copied = to_mesh(filled, active, stream=other)
    assert copied.stream is other
    with other.activate():
        plus = copied + 1
    assert close(plus, lambda: torch.full((2,), 4.0), gpus=1)


def test_a_mesh_refuses_more_streams_than_its_workers_run(
    active: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.ones(1)  # the main stream is known
    monkeypatch.setattr(monarch.tensor._mesh, "MAX_STREAMS", len(active.client._streams))
    with Stream("one too many").activate(), pytest.raises(RuntimeError, match="at most"):
        torch.ones(1)


def test_tensors_made_under_an_active_mesh_carry_plain_meta_fakes(active: Any) -> None:
    x = dist(torch.ones(4))
    made = [
        x.reduce("gpus", "sum"),
        active.rank("gpus"),
        to_mesh(x, active),
        remote(pair, propagate=lambda x: (torch.zeros(4), torch.zeros(())))(x)[0],
        remote(data_dependent, propagate="cached")(x)[0],
    ]
    for t in made:
        assert type(t._fake) is torch.Tensor  # not a distributed tensor (would send ops)
        assert t._fake.device.type == "meta"


def test_coalescing_sends_the_block_at_its_end(active: Any) -> None:
    client = active.client
    client.flush()
    sent = client.sent_batches
    with coalescing():
        x = torch.ones(3)
        y = x * 2 + 1
        with coalescing():  # nested: part of the outer block
            z = y.sum()
        client.flush()  # held until the block ends
        assert client.sent_batches == sent
    assert client.sent_batches == sent + 1
    assert close(z, lambda: torch.tensor(9.0), gpus=1)


def test_coalescing_refuses_fetches_and_drops_an_abandoned_block(active: Any) -> None:
    with (
        pytest.raises(NotImplementedError, match="NYI: fetching results during a coalescing block"),
        coalescing(),
    ):
        fetch_shard(torch.ones(2) + 1)
    kept = dist(torch.zeros(2))
    made: list[Any] = []

    def abandoned() -> None:
        with coalescing():
            made.append(torch.ones(2) + 5)
            kept.add_(1)
            raise KeyError("boom")

    with pytest.raises(KeyError):
        abandoned()
    (dropped,) = made
    with pytest.raises(RemoteException, match="not on this worker"):
        fetch_shard(dropped, gpus=0).get(timeout=T)
    assert close(kept, lambda: torch.zeros(2), gpus=0)  # the block's mutation was dropped too
    assert close(torch.ones(1) * 3, lambda: torch.full((1,), 3.0), gpus=1)
