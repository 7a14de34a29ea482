"""``bench/rest.py --lab``'s per-host figures: a region's host counts its node and its
PostgreSQL, a peer server's host its postmaster in the peer's best write run; the client's
CPU (the bench process) is no host's."""

from __future__ import annotations

from bench.rest import hosts_summary


def test_each_host_gets_the_cores_of_its_own_processes() -> None:
    route = {
        "events_per_s": 1000.0,
        "cpu_s_per_1000_events": {
            "node-us-east": 0.3, "postgres-us-east": 0.1, "node-eu-west": 0.2,
            "postgres-eu-west": 0.05,
        },
    }  # fmt: skip
    peer = {
        "63-before": {"events_per_s": 2000.0, "cpu_s_per_1000_events": {"postgres-primary": 0.2}},
        "63-after": {
            "events_per_s": 4000.0,
            "cpu_s_per_1000_events": {
                "postgres-primary": 0.1,
                "postgres-standby-1": 0.02,
                "bench process": 0.5,
            },
        },
        "reads-63-after": {"reads_per_s": 9000.0, "cpu_s_per_1000_reads": {}},
    }
    hosts = hosts_summary(route, peer, quota=0.5)
    assert hosts == {
        "us-east": {"cores": 0.4, "of_quota": 0.8},
        "eu-west": {"cores": 0.25, "of_quota": 0.5},
        "pg-primary": {"cores": 0.4, "of_quota": 0.8},  # the best run's, 4,000 events/s
        "pg-s1": {"cores": 0.08, "of_quota": 0.16},
    }
