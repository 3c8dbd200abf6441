//! Failure under pressure: dead backends, exhausted descriptors and threads, the pool after a flood.

/// A backend out of rotation (down, drained) gives its share to all the
/// backends left, in proportion to their weights, not to its neighbour in
/// the list.
mod spread_over_the_rest {
    use std::collections::HashMap;
    use std::time::Duration;

    use crate::common::{closed_port, request, until, Demo, TestBalancer};
    use rodizio::health::{CheckKind, HealthConfig};
    use rodizio::scheduler::Algorithm;

    /// `requests` sequential requests through `lb`; how many each demo
    /// backend answered, by name.
    fn split(lb: &TestBalancer, requests: usize) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for i in 0..requests {
            let name = request(lb.addr).unwrap_or_else(|e| panic!("request {i}: {e}"));
            *counts.entry(name).or_insert(0) += 1;
        }
        counts
    }

    fn expected(pairs: &[(&str, usize)]) -> HashMap<String, usize> {
        pairs.iter().map(|&(n, c)| (n.to_string(), c)).collect()
    }

    /// Round robin over a, b, (c: a closed port, found down by the health
    /// checks), d: 240 requests are exactly 80 each, not 60 / 60 / 120.
    #[test]
    fn a_dead_backends_share_is_spread_evenly_over_the_rest() {
        let (a, b, d) = (
            Demo::start("127.0.0.1:0", "a"),
            Demo::start("127.0.0.1:0", "b"),
            Demo::start("127.0.0.1:0", "d"),
        );
        let dead = closed_port();
        let lb = TestBalancer::with(&[a.addr, b.addr, dead, d.addr], |config| {
            config.health = HealthConfig {
                check: CheckKind::Tcp,
                interval: Duration::from_millis(200),
                timeout: Duration::from_secs(2),
                fall: 1,
                ..HealthConfig::default()
            };
        });
        let c = lb.backend(dead);
        until("the closed port is found DOWN", || !c.is_healthy());
        assert_eq!(
            split(&lb, 240),
            expected(&[("a", 80), ("b", 80), ("d", 80)])
        );
        assert!(!c.is_healthy());
        lb.stop();
    }

    /// Weighted round robin, weights 1, 3, 2, 5, the last two drained: 100
    /// requests are exactly 25 and 75, not about 73 and 27 (the drained
    /// backends' turns falling to a, the next one in the list).
    #[test]
    fn drained_backends_share_goes_to_the_rest_by_weight() {
        let demos: Vec<Demo> = ["a", "b", "c", "d"]
            .iter()
            .map(|name| Demo::start("127.0.0.1:0", name))
            .collect();
        let addrs: Vec<_> = demos.iter().map(|d| d.addr).collect();
        let lb = TestBalancer::with(&addrs, |config| {
            config.algorithm = Algorithm::WeightedRoundRobin;
            for (spec, weight) in config.backends.iter_mut().zip([1, 3, 2, 5]) {
                spec.weight = weight;
            }
        });
        for addr in &addrs[2..] {
            lb.scheduler.drain(lb.backend(*addr).id(), true).unwrap();
        }
        assert_eq!(split(&lb, 100), expected(&[("a", 25), ("b", 75)]));
        assert_eq!(split(&lb, 100), expected(&[("a", 25), ("b", 75)]));
        lb.stop();
    }
}
