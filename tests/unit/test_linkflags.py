"""Link flags: units parsed, printed in human form, bad values named; the Links they build."""
import math

import pytest

from pipert.linkflags import LinkOptions, format_bandwidth, format_duration, parse_bandwidth, parse_duration


@pytest.mark.parametrize("text,seconds", [("20ms", 0.02), ("150us", 150e-6), ("150 µs", 150e-6), ("0.5s", 0.5),
                                          ("2e-3", 2e-3), ("40ns", 40e-9), (0.25, 0.25)])
def test_durations_parse_to_seconds(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize("text,bps", [("10Gbps", 1.25e9), ("800 Mbps", 1e8), ("400MB/s", 4e8), ("1GiB/s", 2 ** 30),
                                      ("inf", math.inf), ("", math.inf)])
def test_bandwidths_parse_to_bytes_per_second(text, bps):
    assert parse_bandwidth(text) == pytest.approx(bps, rel=1e-12)


@pytest.mark.parametrize("fn,text,needle", [(parse_duration, "20 minutes", "unknown time unit"),
                                            (parse_duration, "fast", "not a number"),
                                            (parse_bandwidth, "10 Gbit", "unknown bandwidth unit"),
                                            (parse_bandwidth, "0Gbps", "must be > 0")])
def test_bad_values_name_flag_value_and_allowed_units(fn, text, needle):
    with pytest.raises(ValueError, match=needle) as e:
        fn(text, "--dc-x")
    assert "--dc-x" in str(e.value) and repr(text) in str(e.value)


def test_human_forms():
    assert format_duration(0.02) == "20 ms" and format_duration(150e-6) == "150 us" and format_duration(0) == "0 s"
    assert format_bandwidth(1.25e9) == "10 Gbit/s" and format_bandwidth(math.inf) == "unlimited"
    opts = LinkOptions.parse(dcs=2, dc_latency="20ms", dc_bandwidth="10Gbps")
    assert opts.describe() == "2 DCs: 20 ms, 10 Gbit/s between them"


def test_links_put_the_dc_spec_on_dc_crossings_only():
    opts = LinkOptions.parse(dcs=2, dc_latency="20ms", dc_bandwidth="10Gbps", ranks_per_node=1,
                             node_latency="10us", node_bandwidth="100Gbps")
    links = opts.links(4)
    assert links.transfer(1, 2, 1.25e7) == pytest.approx((0.01, 0.02))
    assert links.transfer(0, 1, 1.25e7) == pytest.approx((1e-3, 1e-5))
    assert LinkOptions.parse(dcs=2, dc_latency="1ms").links(4).transfer(0, 1, 1e9) == (0.0, 0.0)
    em = opts.emulator(4, backend="python")
    assert em.link(2, 1).latency == pytest.approx(0.02) and em.link(2, 1).bandwidth == pytest.approx(1.25e9)


@pytest.mark.parametrize("kw,needle", [(dict(dcs=1, dc_latency="1ms"), "give --dcs >= 2"),
                                       (dict(node_latency="1ms"), "give --ranks-per-node"),
                                       (dict(dcs=0), "--dcs must be an integer >= 1")])
def test_inconsistent_flags_are_rejected(kw, needle):
    with pytest.raises(ValueError, match=needle):
        LinkOptions.parse(**kw)


def test_a_dc_count_that_does_not_divide_the_ranks_is_rejected():
    with pytest.raises(ValueError, match="--dcs 3 does not divide the 4 ranks"):
        LinkOptions.parse(dcs=3, dc_latency="1ms").links(4)


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1", "tawpipe"])
def test_train_ranks_per_node_shapes_the_links_of_any_schedule(schedule):
    """--ranks-per-node is a link flag for every schedule and a generator option only for those
    that take it (tawpipe groups ranks by node)."""
    from pipert.schedules import build_schedule, family
    from pipert.train import TrainConfig, build_program
    cfg = TrainConfig(schedule=schedule, stages=4, microbatches=8, ranks_per_node=2, node_latency="10us")
    cfg.validate()
    takes = "ranks_per_node" in (family(schedule).options() or ())
    expected = build_schedule(schedule, stages=4, microbatches=8, **({"ranks_per_node": 2} if takes else {}))
    assert build_program(cfg).to_schedule().actions == expected.actions
    assert cfg.link_options().ranks_per_node == 2
