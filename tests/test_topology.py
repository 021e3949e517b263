import os
import sys
import types

import pytest
from sysfs_fixtures import FakeSysfs, dual_socket, mariana

from pyring.topology import LEVEL_NAMES, Topology, detect, flat, parse
from pyring.topology.pci import local_gpu_path, pci_path

# --- parse ------------------------------------------------------------------------------------


def test_two_levels_of_text():
    t = parse("0,1;2,3|4,5;6,7", 8)
    assert t.levels == ("switch", "host")
    assert t.groups == (((0, 1), (2, 3), (4, 5), (6, 7)), ((0, 1, 2, 3), (4, 5, 6, 7)))


@pytest.mark.parametrize("spec, groups", [
    ("0,1;2,3", ((0, 1), (2, 3))),
    ("0,1,2,3", ((0, 1, 2, 3),)),
    (" 0 , 1 ;\t2,3 ", ((0, 1), (2, 3))),
    ("3,1;2,0", ((3, 1), (2, 0))),          # written order is the ring order
    ("0;1;2;3", ((0,), (1,), (2,), (3,))),  # the only level stays, singletons or not
    ("0;1|2;3", ((0, 1), (2, 3))),          # a lowest level of singletons goes
    ("0,1|2,3", ((0, 1), (2, 3))),          # of two equal levels the upper name stays
])
def test_one_level_of_text(spec, groups):
    t = parse(spec, 4)
    assert (t.levels, t.groups) == (("host",), (groups,))


def test_flat():
    assert parse(" FLAT ", 3) == flat(3) == Topology(3, ("host",), (((0, 1, 2),),))
    assert parse("flat", 1).order() == [0]


@pytest.mark.parametrize("spec, levels", [
    ([0, 1, 2, 3], ("host",)),
    ([[0, 1], [2, 3]], ("host",)),
    ([[[0, 1], [2, 3]]], ("switch", "host")),
    ([[[[0], [1, 2]], [[3]]]], ("switch", "socket", "host")),
    ([[[[0], [1]], [[2, 3]]]], ("socket", "host")),
    ([[[[[0, 1]], [[2], [3]]]]], ("switch", "host")),
    (((0, 1), (2, 3)), ("host",)),
])
def test_nested_lists_name_levels_from_the_top(spec, levels):
    assert parse(spec, 4).levels == levels


def test_nested_four_levels():
    t = parse([[[[[0, 1], [2]], [[3]]], [[[4, 5]]]], [[[[6], [7]]]]], 8)
    assert t.levels == LEVEL_NAMES
    assert t.groups == (((0, 1), (2,), (3,), (4, 5), (6,), (7,)),
                        ((0, 1, 2), (3,), (4, 5), (6, 7)),
                        ((0, 1, 2, 3), (4, 5), (6, 7)),
                        ((0, 1, 2, 3, 4, 5), (6, 7)))
    assert parse(t.spec(), 8) == t


def test_levels_of_single_ranks_or_single_members_are_dropped():
    # 2 and 3 sit on switches of their own: that switch level says nothing.
    assert parse("0,1|2;3", 4) == parse("0,1;2,3", 4)
    assert parse([[[0, 1]], [[2], [3]]], 4) == parse("0,1;2,3", 4)
    t = parse([[[[0, 1], [2, 3]]], [[[4], [5]]]], 6)
    assert (t.levels, t.groups) == (("switch", "host"), (((0, 1), (2, 3), (4,), (5,)),
                                                         ((0, 1, 2, 3), (4, 5))))


@pytest.mark.parametrize("spec", [[[[0, 1], [2, 3]], [4], [5]], [[[0, 1], [2, 3]], 4, [5]],
                                  "[[[0,1],[2,3]],[4],[5]]", "0,1;2,3|4|5"])
def test_mixed_depth_is_padded_with_singletons(spec):
    t = parse(spec, 6)
    assert t.levels == ("switch", "host")
    assert t.groups == (((0, 1), (2, 3), (4,), (5,)), ((0, 1, 2, 3), (4,), (5,)))


def test_mixed_depth_pads_below_the_shallow_branch():
    t = parse([[[0, 1], [2, 3]], [4, 5]], 6)
    assert t.groups == (((0, 1), (2, 3), (4,), (5,)), ((0, 1, 2, 3), (4, 5)))


@pytest.mark.parametrize("spec, world, why", [
    ("0,1;2", 4, "rank 3 is missing (world size 4)"),
    ("0;2", 4, "ranks 1,3 are missing (world size 4)"),
    ("0,1;2,2", 4, "rank 2 appears twice"),
    ("0,1|1,2;3", 4, "rank 1 appears twice"),
    ("0,1;2,3,7", 4, "rank 7 is out of range for world size 4"),
    ("0,1;-1,2,3", 4, "rank -1 is out of range for world size 4"),
    ("0,1;;2,3", 4, "empty group"),
    ("0,1|;2,3", 4, "empty group"),
    ("0,1||2,3", 4, "empty group"),
    ("", 4, "empty group"),
    ("0,1;a,3", 4, "'a' is not a rank"),
    ("0,1,,2,3", 4, "'' is not a rank"),
    ("0,1.5,2,3", 4, "'1.5' is not a rank"),
    ("auto", 4, "'auto' is not a rank"),
    ("[[0,1],[2,3]", 4, "not valid JSON"),
    ("[[0,1],[2,true]]", 4, "True is not a rank"),
    ([[0, 1], [2, 3.0]], 4, "3.0 is not a rank"),
    ([[0, 1], [2, "3"]], 4, "'3' is not a rank"),
    ([[0, 1], [2, None]], 4, "None is not a rank"),
    ([[0, 1], [2, False]], 4, "False is not a rank"),
    ([[0, 1], [2, 3], []], 4, "empty group"),
    ([], 4, "no groups"),
    ("[]", 4, "no groups"),
    ("[3]", 4, "ranks 0,1,2 are missing"),
    ([[[[[[0, 1, 2, 3]]]]]], 4, "nested more than 4 levels deep"),
    ({0: 1}, 4, "got dict"),
    (7, 4, "got int"),
    (flat(3), 4, "a topology of world size 3, not 4"),
])
def test_bad_specs_name_the_problem(spec, world, why):
    with pytest.raises(ValueError) as e:
        parse(spec, world, source="PYRING_TOPOLOGY")
    assert str(e.value).startswith(f"PYRING_TOPOLOGY {spec!r}: ")
    assert why in str(e.value)


def test_message_prefix():
    with pytest.raises(ValueError, match=r"^PYRING_TOPOLOGY '0,1;2': rank 3 is missing "
                                         r"\(world size 4\)$"):
        parse("0,1;2", 4, source="PYRING_TOPOLOGY")
    with pytest.raises(ValueError, match=r"^topology '0,1': "):
        parse("0,1", 3)
    with pytest.raises(ValueError, match="world size must be a positive int"):
        parse("flat", 0, source="init(topology=...)")


# --- Topology -----------------------------------------------------------------------------------

ROUND_TRIP = [("0,1;2,3|4,5;6,7", 8), ("0,1;2,3", 4), ("0,1,2,3", 4), ("3,2;1,0", 4),
              ("0;1;2;3", 4), ("0,1|2,3;4,5", 6), ("flat", 5), ("[[[0,1],[2,3]]]", 4),
              ("[[[[0,1],[2,3]],[[4,5],[6,7]]]]", 8), ("[[[[[0,1]],[[2],[3]]]]]", 4),
              ("[[[[[0,1],[2]],[[3]]],[[[4,5]]]],[[[[6],[7]]]]]", 8),
              ("[[[0,1],[2,3]],[4],[5]]", 6), ("[[[[0,1],[2,3]],[[4]]],[[[5,6]]]]", 7)]


@pytest.mark.parametrize("spec, world", ROUND_TRIP)
def test_spec_nested_order_round_trip(spec, world):
    t = parse(spec, world)
    assert parse(t.spec(), world) == t
    assert parse(t.nested(), world) == t
    assert hash(parse(t.spec(), world)) == hash(t)
    for level in t.groups:
        assert [r for g in level for r in g] == t.order()
    assert sorted(t.order()) == list(range(world))
    assert len(t.describe().splitlines()) == len(t.groups[-1])


def test_spec_forms():
    assert parse("0,1;2,3|4,5;6,7", 8).spec() == "0,1;2,3|4,5;6,7"
    assert parse(" 1 ,0 ; 3,2", 4).spec() == "1,0;3,2"
    assert flat(3).spec() == "0,1,2"
    assert parse([[[0, 1], [2, 3]]], 4).spec() == "[[[0,1],[2,3]]]"
    assert parse([[[0, 1], [2, 3]]], 4).nested() == [[[0, 1], [2, 3]]]
    assert flat(2).nested() == [[0, 1]]


def test_describe():
    assert parse("0,1;2,3|4,5;6,7", 8).describe() == (
        "host 0: switch 0 (ranks 0,1), switch 1 (ranks 2,3)\n"
        "host 1: switch 2 (ranks 4,5), switch 3 (ranks 6,7)")
    assert flat(3).describe() == "host 0: ranks 0,1,2"
    assert parse("0;1,2", 3).describe() == "host 0: rank 0\nhost 1: ranks 1,2"
    assert parse([[[[0, 1], [2, 3]], [[4, 5]]]], 6).describe() == (
        "host 0: socket 0 [switch 0 (ranks 0,1), switch 1 (ranks 2,3)], switch 2 (ranks 4,5)")


def test_is_flat():
    assert flat(4).is_flat() and parse("0;1;2;3", 4).is_flat() and parse("3,2,1,0", 4).is_flat()
    assert not parse("0,1;2,3", 4).is_flat()
    assert not parse([[[0, 1], [2, 3]]], 4).is_flat()


def test_constructor_stores_tuples_and_compares_by_value():
    t = Topology(4, ["switch", "host"], [[[0, 1], [2, 3]], [[0, 1, 2, 3]]])
    assert t == parse([[[0, 1], [2, 3]]], 4) and isinstance(t.groups[0][0], tuple)
    assert len({t, parse([[[0, 1], [2, 3]]], 4)}) == 1
    with pytest.raises(AttributeError):
        t.world = 5


@pytest.mark.parametrize("world, levels, groups, why", [
    (0, ("host",), (((),),), "world must be a positive int"),
    (2, (), (), "at least one level"),
    (2, ("host",), (((0,), (1,)), ((0, 1),)), "one name per level"),
    (2, ("rack",), (((0, 1),),), "unknown level name 'rack'"),
    (2, ("host", "switch"), (((0,), (1,)), ((0, 1),)), "not lowest first"),
    (2, ("host", "host"), (((0,), (1,)), ((0, 1),)), "only 'switch' may repeat"),
    (3, ("host",), (((0, 1), ()),), "empty group"),
    (3, ("host",), (((0, 1),),), "level 'host': rank 2 is missing"),
    (2, ("host",), (((0, 1, 1),),), "rank 1 appears twice"),
    (2, ("host",), (((0, 2),),), "rank 2 is out of range"),
    (2, ("host",), (((0, True),),), "not an int"),
    (4, ("switch", "host"), (((0, 1), (2, 3)), ((0, 2), (1, 3))), "not made of consecutive"),
    (4, ("switch", "host"), (((0, 1), (2, 3)), ((1, 0, 2, 3),)), "not made of consecutive"),
    (3, ("switch", "host"), (((0, 1), (2,)), ((0,), (1, 2))), "not made of consecutive"),
])
def test_constructor_checks_invariants(world, levels, groups, why):
    with pytest.raises(ValueError, match=why):
        Topology(world, levels, groups)


# --- pci_path -------------------------------------------------------------------------------------


def test_pci_path_reads_the_tree(tmp_path):
    gpus = dual_socket(tmp_path)
    assert pci_path(gpus[0], str(tmp_path)) == [
        "numa0", "pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:08.0", "0000:03:00.0"]
    socket1 = ["numa1", "pci0000:80", "0000:80:01.0", "0000:81:00.0", "0000:82:08.0",
               "0000:83:00.0"]
    for bus_id in ("0000:83:00.0", "00000000:83:00.0", "0000:83:00.0".upper(), "83:00.0"):
        assert pci_path(bus_id, str(tmp_path)) == socket1


def test_pci_path_without_numa_names_the_root_complex(tmp_path):
    gpus = dual_socket(tmp_path, numa=False)
    assert pci_path(gpus[7], str(tmp_path))[:2] == ["pci0000:80", "pci0000:80"]
    fs = FakeSysfs(tmp_path)
    fs.add(["pci0001:00", "0001:00:02.0", "0001:01:00.0"], numa=None)
    assert pci_path("0001:01:00.0", str(tmp_path)) == [
        "pci0001:00", "pci0001:00", "0001:00:02.0", "0001:01:00.0"]


def test_pci_path_resolves_absolute_links_inside_the_root(tmp_path):
    gpus = mariana(tmp_path)
    link = tmp_path / "bus" / "pci" / "devices" / gpus[4]
    link.unlink()
    link.symlink_to("/sys/devices/pci0000:00/0000:00:03.0/0000:0c:00.0")
    assert pci_path(gpus[4], str(tmp_path)) == [
        "numa0", "pci0000:00", "0000:00:03.0", "0000:0c:00.0"]


def test_pci_path_errors(tmp_path):
    mariana(tmp_path)
    missing = os.path.join(str(tmp_path), "bus", "pci", "devices", "0000:3b:00.0")
    with pytest.raises(ValueError, match=f"'0000:3B:00.0'.*{missing} is missing"):
        pci_path("0000:3B:00.0", str(tmp_path))
    with pytest.raises(ValueError, match="'gpu0' is not a PCI bus id"):
        pci_path("gpu0", str(tmp_path))
    (tmp_path / "bus" / "pci" / "devices" / "0000:0d:00.0").unlink()
    (tmp_path / "bus" / "pci" / "devices" / "0000:0d:00.0").symlink_to("../../../nowhere")
    with pytest.raises(ValueError, match="not to a device 0000:0d:00.0"):
        pci_path("0000:0d:00.0", str(tmp_path))


def test_local_gpu_path_is_none_without_cuda():
    assert local_gpu_path() is None


def _fake_torch(props=None, error=None):
    def is_available():
        if error:
            raise error
        return True

    cuda = types.SimpleNamespace(is_available=is_available, current_device=lambda: 3,
                                 get_device_properties=lambda i: props)
    return types.SimpleNamespace(cuda=cuda)


def test_local_gpu_path_asks_torch_for_the_pci_ids(tmp_path, monkeypatch):
    dual_socket(tmp_path)
    props = types.SimpleNamespace(pci_domain_id=0, pci_bus_id=0x88, pci_device_id=0)
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(props))
    assert local_gpu_path(str(tmp_path))[-1] == "0000:88:00.0"
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(types.SimpleNamespace()))
    assert local_gpu_path(str(tmp_path)) is None
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(error=RuntimeError("no driver")))
    assert local_gpu_path(str(tmp_path)) is None
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(props))
    assert local_gpu_path(str(tmp_path / "empty")) is None


# --- detect ---------------------------------------------------------------------------------------


def _paths(tmp_path, server, gpu_of_rank, **kw):
    gpus = server(tmp_path, **kw)
    return [pci_path(gpus[g], str(tmp_path)) for g in gpu_of_rank]


def test_detect_mariana(tmp_path):
    t = detect(["h"] * 6, _paths(tmp_path, mariana, range(6)))
    assert t.levels == ("switch", "switch", "host")
    assert t.groups == (((0, 1), (2, 3), (4,), (5,)), ((0, 1, 2, 3), (4,), (5,)),
                        ((0, 1, 2, 3, 4, 5),))
    assert t.describe() == ("host 0: switch-1 0 [switch-2 0 (ranks 0,1), switch-2 1 "
                            "(ranks 2,3)], rank 4, rank 5")
    assert parse(t.spec(), 6).groups == t.groups


def test_detect_mariana_shuffled(tmp_path):
    # rank r on GPU [4, 2, 0, 5, 3, 1][r]: ranks 2,5 on switch A, 1,4 on switch B, 0,3 on the IOH
    t = detect(["h"] * 6, _paths(tmp_path, mariana, [4, 2, 0, 5, 3, 1]))
    assert t.levels == ("switch", "switch", "host")
    assert t.groups == (((0,), (1, 4), (2, 5), (3,)), ((0,), (1, 4, 2, 5), (3,)),
                        ((0, 1, 4, 2, 5, 3),))
    assert t.order() == [0, 1, 4, 2, 5, 3]


@pytest.mark.parametrize("numa", [True, False])
def test_detect_dual_socket(tmp_path, numa):
    t = detect(["h"] * 8, _paths(tmp_path, dual_socket, range(8), numa=numa))
    assert t.levels == ("switch", "socket", "host")
    assert t.groups == (((0, 1), (2, 3), (4, 5), (6, 7)), ((0, 1, 2, 3), (4, 5, 6, 7)),
                        ((0, 1, 2, 3, 4, 5, 6, 7),))
    assert parse(t.spec(), 8) == t and parse(t.nested(), 8) == t
    assert t.describe() == ("host 0: socket 0 [switch 0 (ranks 0,1), switch 1 (ranks 2,3)], "
                            "socket 1 [switch 2 (ranks 4,5), switch 3 (ranks 6,7)]")


def test_detect_dual_socket_shuffled(tmp_path):
    t = detect(["h"] * 8, _paths(tmp_path, dual_socket, [5, 0, 7, 2, 4, 1, 6, 3]))
    assert t.levels == ("switch", "socket", "host")
    assert t.groups == (((0, 4), (2, 6), (1, 5), (3, 7)), ((0, 4, 2, 6), (1, 5, 3, 7)),
                        ((0, 4, 2, 6, 1, 5, 3, 7),))


def test_detect_two_dual_socket_hosts(tmp_path):
    paths = _paths(tmp_path, dual_socket, range(8))
    t = detect(["10.0.0.1"] * 8 + ["10.0.0.2"] * 8, paths + paths)
    assert t.levels == ("switch", "socket", "host")
    assert t.groups == (tuple((i, i + 1) for i in range(0, 16, 2)),
                        tuple(tuple(range(i, i + 4)) for i in range(0, 16, 4)),
                        (tuple(range(8)), tuple(range(8, 16))))
    assert t.spec() == "[[[[0,1],[2,3]],[[4,5],[6,7]]],[[[8,9],[10,11]],[[12,13],[14,15]]]]"
    # Ranks alternate between the hosts; rank r uses GPU r // 2 of its host.
    t = detect(["b", "a"] * 8, [paths[r // 2] for r in range(16)])
    assert t.groups == (((0, 2), (4, 6), (8, 10), (12, 14), (1, 3), (5, 7), (9, 11), (13, 15)),
                        ((0, 2, 4, 6), (8, 10, 12, 14), (1, 3, 5, 7), (9, 11, 13, 15)),
                        ((0, 2, 4, 6, 8, 10, 12, 14), (1, 3, 5, 7, 9, 11, 13, 15)))


def test_detect_ranks_sharing_a_gpu(tmp_path):
    t = detect(["h"] * 16, _paths(tmp_path, dual_socket, [r // 2 for r in range(16)]))
    assert t.levels == LEVEL_NAMES
    assert t.groups[0] == tuple((i, i + 1) for i in range(0, 16, 2))
    assert t.groups[1] == tuple(tuple(range(i, i + 4)) for i in range(0, 16, 4))
    assert t.groups[2:] == (((*range(8),), (*range(8, 16),)), ((*range(16),),))
    assert parse(t.spec(), 16) == t


def test_detect_two_ranks_on_one_gpu_beside_others(tmp_path):
    # ranks 0, 1 on switch B's first GPU, rank 2 on its second, rank 3 on the IOH
    t = detect(["h"] * 4, _paths(tmp_path, mariana, [2, 2, 3, 4]))
    assert t.levels == ("gpu", "switch", "host")
    assert t.groups == (((0, 1), (2,), (3,)), ((0, 1, 2), (3,)), ((0, 1, 2, 3),))
    assert t.describe() == "host 0: switch 0 [gpu 0 (ranks 0,1), rank 2], rank 3"


def test_detect_one_gpu_for_all_ranks_is_flat(tmp_path):
    assert detect(["h"] * 3, _paths(tmp_path, mariana, [1, 1, 1])) == flat(3)


def test_detect_cpu_hosts():
    assert detect(["h"] * 5, [None] * 5) == flat(5)
    assert detect(["h"], [None]) == flat(1)
    t = detect(["a", "a", "b", "b", "b"], [None] * 5)
    assert (t.levels, t.groups) == (("host",), (((0, 1), (2, 3, 4)),))
    t = detect(["y", "x", "y"], [None] * 3)
    assert t.groups == (((0, 2), (1,)),) and t.order() == [0, 2, 1]


def test_detect_gpu_host_beside_cpu_hosts(tmp_path):
    paths = _paths(tmp_path, dual_socket, range(8))
    t = detect(["g"] * 8 + ["c"] * 2, paths + [None, None])
    assert t.levels == ("switch", "socket", "host")
    assert t.groups == (((0, 1), (2, 3), (4, 5), (6, 7), (8,), (9,)),
                        ((0, 1, 2, 3), (4, 5, 6, 7), (8,), (9,)),
                        ((0, 1, 2, 3, 4, 5, 6, 7), (8, 9)))
    # A host where one rank has no GPU holds its ranks directly.
    t = detect(["g"] * 4 + ["c"] * 2, paths[:4] + [paths[4], None])
    assert t.groups == (((0, 1), (2, 3), (4,), (5,)), ((0, 1, 2, 3), (4, 5)))


def test_detect_is_deterministic(tmp_path):
    paths = _paths(tmp_path, mariana, [4, 2, 0, 5, 3, 1])
    first = detect(["h"] * 6, paths)
    assert detect(["k"] * 6, [list(p) for p in paths]) == first
    assert detect(tuple(["h"] * 6), tuple(tuple(p) for p in paths)) == first


def test_detect_rejects_bad_inputs():
    with pytest.raises(ValueError, match="2 host keys and 1 paths"):
        detect(["a", "b"], [None])
    with pytest.raises(ValueError, match="0 host keys"):
        detect([], [])
    with pytest.raises(ValueError, match="rank 1 has GPU path 'pci0000:00'"):
        detect(["a", "a"], [["numa0"], "pci0000:00"])
