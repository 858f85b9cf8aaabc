"""The memory oracle measures what it claims and catches reallocation (SPEC 5.4)."""

import torch

import gefen_reference as reference
from gefen_oracles.memory import StorageTracker, peak_extra_bytes, pointer_reuse, state_addresses

MiB = 1 << 20


def test_peak_counts_live_storage_not_views_or_inplace():
    resident = torch.zeros(MiB // 4)  # 1 MiB resident, not counted

    def work():
        a = torch.ones(MiB // 4)  # +1 MiB
        v = a.view(2, -1)  # view: no new storage
        a.add_(1)  # in place
        b = a * 2  # +1 MiB -> peak 2 MiB
        del a, v, b
        c = torch.ones(MiB // 4)  # after frees: 1 MiB
        resident.mul_(2)
        return c

    c, peak = peak_extra_bytes(work)
    assert peak == 2 * MiB


def test_peak_distinguishes_one_slot_from_all_slots():
    """A bounded save holds one dense slot at a time; an eager one holds all of them."""
    sizes = [MiB // 4] * 4

    def one_at_a_time():
        for n in sizes:
            dense = torch.ones(n)
            del dense

    def all_at_once():
        held = [torch.ones(n) for n in sizes]
        return len(held)

    assert peak_extra_bytes(one_at_a_time)[1] == MiB
    assert peak_extra_bytes(all_at_once)[1] == 4 * MiB


def test_tracker_releases_on_free():
    tracker = StorageTracker()
    with tracker:
        x = torch.ones(1000)
    assert tracker.live_bytes == 4000
    del x
    assert tracker.live_bytes == 0 and tracker.peak_bytes == 4000


def _stepped():
    p = torch.nn.Parameter(torch.randn(64, 32))
    opt = reference.Gefen([p], factored_v_2d=False)
    p.grad = torch.randn(64, 32)
    opt.step()
    return p, opt


def test_reference_step_updates_state_in_place():
    p, opt = _stepped()
    before = state_addresses(opt.state)
    p.grad = torch.randn(64, 32)
    opt.step()
    report = pointer_reuse(before, state_addresses(opt.state))
    assert report.share == 1.0 and report.moved == [] and report.total_bytes > 0


def test_reallocating_step_is_caught():
    p, opt = _stepped()
    before = state_addresses(opt.state)
    p.grad = torch.randn(64, 32)
    opt.step()
    st = opt.state[p]
    st["vmean"] = st["vmean"].clone()  # what a step that rebuilds its state would do
    report = pointer_reuse(before, state_addresses(opt.state))
    assert report.share < 1.0 and (p, "vmean") in report.moved
