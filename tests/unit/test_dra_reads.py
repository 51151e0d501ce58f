"""common.dra_reads: what a parse read of the DRA inventory, and whether a change concerns it. (The builder's use of it,
a pod parsed again only when it must, is proven in tests/unit/test_snapshot_builder.py.)"""

from __future__ import annotations

from common import dra, dra_reads
from tests import builders as b

CLASSES = ("gpu.nvidia.com",)


def inventory(*claims: dict[str, object]) -> dra.Inventory:
    return dra.build(device_classes=[b.device_class()], slices=[b.resource_slice("d", 8)], claims=claims,
                     gpu_classes=CLASSES)


def test_reads_note_hits_misses_and_whole_map_reads() -> None:
    reads: set[dra_reads.Entry] = set()
    view = dra_reads.recording(inventory(b.resource_claim("c", devices=[("d", 0)])), reads)
    assert view.claims["default/c"].devices
    assert "default/gone" not in view.specs
    assert view.owners.get("default/other") is None
    assert reads == {("claims", "default/c"), ("specs", "default/gone"), ("owners", "default/other")}
    reads.clear()
    assert len(view.templates) == 0
    assert reads == {("templates", dra_reads.EVERY)}
    reads.clear()
    assert list(view.claims) == ["default/c"]
    assert reads == {("claims", dra_reads.EVERY)}


def test_a_change_concerns_the_parses_that_read_its_entry() -> None:
    was = inventory(b.resource_claim("c", devices=[("d", 0)]), b.resource_claim("x"))
    now = inventory(b.resource_claim("c", devices=[("d", 1)]), b.resource_claim("x"), b.resource_claim("new"))
    touched = dra_reads.changed(was, now)
    assert touched is not None
    assert dra_reads.concerned({("claims", "default/c")}, touched)  # reallocated
    assert dra_reads.concerned({("specs", "default/new")}, touched)  # missed before, there now
    assert not dra_reads.concerned({("specs", "default/x"), ("claims", "default/x")}, touched)  # unchanged
    assert dra_reads.concerned({("specs", dra_reads.EVERY)}, touched)  # a whole-map read: any change of the map
    assert not dra_reads.concerned({("templates", dra_reads.EVERY)}, touched)


def test_a_change_of_what_every_parse_reads_concerns_all() -> None:
    was = inventory()
    assert dra_reads.changed(was, dra.build(device_classes=[], slices=[], claims=[], gpu_classes=CLASSES)) is None
    assert dra_reads.changed(was, dra.build(device_classes=[b.device_class()], slices=[b.resource_slice("d", 8)],
                                            claims=[], gpu_classes=CLASSES, served=False)) is None
    assert dra_reads.concerned(set(), None)
    assert dra_reads.changed(was, inventory()) == set()
