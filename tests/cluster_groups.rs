//! Clusters of node groups (`[[cluster.groups]]`): bad input exits 2 naming
//! the field; a two-group run prices each stage on its GPU type and carries
//! cross-node transfers on the NICs. Runtime: about 1 s in release.

use crate::{easerve, root};
use std::io::Write;

fn two_group_with(edit: impl Fn(String) -> String) -> tempfile::NamedTempFile {
    let base = std::fs::read_to_string(root().join("scenarios/two-group.toml")).unwrap();
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    f.write_all(edit(base).as_bytes()).unwrap();
    f
}

/// `easerve sim FILE` exits 2 with every needle on stderr and no panic.
fn rejects(f: &tempfile::NamedTempFile, needles: &[&str]) {
    let out = easerve(&["sim", f.path().to_str().unwrap(), "--requests", "20"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    for n in needles {
        assert!(err.contains(n), "message lacks {n:?}: {err}");
    }
}

#[test]
fn tp_larger_than_a_node_is_refused() {
    let f = two_group_with(|s| {
        s.replace("1D(TP4)", "1D(TP16)").replace(
            "nodes = 1\ngpus_per_node = 8\ngpu = \"h100-sxm\"",
            "nodes = 4\ngpus_per_node = 8\ngpu = \"h100-sxm\"",
        )
    });
    rejects(
        &f,
        &["deployment.allocation", "TP stays within a node", "has 8"],
    );
}

#[test]
fn a_group_with_no_nodes_is_refused() {
    let f = two_group_with(|s| s.replacen("nodes = 1", "nodes = 0", 1));
    rejects(&f, &["cluster.groups[0].nodes", "allowed 1"]);
}

#[test]
fn a_nic_without_bandwidth_is_refused() {
    let f = two_group_with(|s| s.replace("nic_bandwidth_gbs = 400.0", "nic_bandwidth_gbs = 0.0"));
    rejects(&f, &["cluster.groups[1].nic_bandwidth_gbs", "must be > 0"]);
}

#[test]
fn a_cost_on_some_groups_only_is_refused() {
    let f = two_group_with(|s| s.replace("cost_per_gpu_hour = 3.0\n", ""));
    rejects(&f, &["cluster.groups[1].cost_per_gpu_hour", "every group"]);
}

#[test]
fn an_allocation_that_does_not_fit_the_groups_is_refused() {
    // 12 H100 GPUs asked of a node of 8: room in the cluster (14), not in the group
    let f = two_group_with(|s| s.replace("6E(TP1)+1P(TP4)", "2E(TP1)+2P(TP4)"));
    rejects(
        &f,
        &[
            "deployment.allocation",
            "does not fit the node groups",
            "group `h100`",
        ],
    );
}

#[test]
fn two_groups_price_stages_per_gpu_type_and_carry_embeddings_on_the_nics() {
    let path = root().join("scenarios/two-group.toml");
    let out = easerve(&["sim", path.to_str().unwrap(), "--requests", "60", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let notes = r["notes"].to_string();
    assert!(
        notes.contains("encode on l40s, prefill on h100-sxm, decode on h100-sxm"),
        "{notes}"
    );
    let links = r["links"].as_array().expect("a links section");
    // encode (l40s node) → prefill (h100 node): one port out, one in; KV
    // caches stay on the h100 node's NVLink
    let names: Vec<&str> = links.iter().map(|l| l["link"].as_str().unwrap()).collect();
    assert_eq!(names, ["l40s/node0 NIC out", "h100/node0 NIC in"]);
    for l in links {
        assert!(l["transfers"].as_u64().unwrap() > 0);
        let u = l["utilisation"].as_f64().unwrap();
        assert!(u > 0.0 && u < 1.0, "{u}");
    }
}

/// Load the two-group scenario with `sets` applied.
fn load(sets: &[(&str, &str)]) -> easerve_workload::scenario::Scenario {
    let sets: Vec<(String, String)> = sets
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let path = root().join("scenarios/two-group.toml");
    easerve_workload::scenario::Scenario::load_with(&path, &sets, &Default::default()).unwrap()
}

/// The one-node scenario of `gpu` with the same model, workload and knobs.
fn one_type(gpu: &str, allocation: &str, offload: &str) -> easerve_workload::scenario::Scenario {
    let text = std::fs::read_to_string(root().join("scenarios/two-group.toml")).unwrap();
    let cut = text.find("\n[[cluster.groups]]").unwrap() + 1;
    let rest = &text[text.find("[deployment]").unwrap()..];
    let rest = rest.split("[deployment.groups]").collect::<Vec<_>>();
    let tail = &rest[1][rest[1].find("[workload]").unwrap()..];
    let mut deployment = rest[0].replace("6E(TP1)+1P(TP4)+1D(TP4)", allocation);
    deployment = deployment.replace("offload = 1.0", &format!("offload = {offload}"));
    let toml = format!(
        "{}gpu = \"{gpu}\"\ngpus = 16\n\n{deployment}{tail}",
        &text[..cut]
    );
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    f.write_all(toml.as_bytes()).unwrap();
    easerve_workload::scenario::Scenario::load(f.path(), &Default::default()).unwrap()
}

/// Per-type costs: each stage of a two-group cluster costs what it costs on
/// its group's GPU alone (encode on L40S, prefill and decode on H100), and a
/// local prefill worker co-located on an encode GPU is priced on the L40S.
/// Runtime: well under 1 s (kernel tables read once per GPU type).
#[test]
fn each_stage_is_priced_on_its_groups_gpu_type() {
    let mixed = load(&[("deployment.offload", "0.5")]);
    let (l40s, h100) = (
        one_type("l40s", "6E(TP1)+1P(TP4)+1D(TP4)", "0.5"),
        one_type("h100-sxm", "6E(TP1)+1P(TP4)+1D(TP4)", "0.5"),
    );
    let (m, l, h) = (mixed.cost(), l40s.cost(), h100.cost());
    let items = [easerve_model::ItemTokens {
        encoder_tokens: 576,
        llm_tokens: 576,
        attn_span: 576,
    }];
    let par = easerve_model::Parallel::from(4);
    assert_eq!(m.encode(&items, 1.0).t_gpu, l.encode(&items, 1.0).t_gpu);
    assert_ne!(l.encode(&items, 1.0).t_gpu, h.encode(&items, 1.0).t_gpu);
    assert_eq!(m.prefill(&[2048], par, 1.0), h.prefill(&[2048], par, 1.0));
    assert_eq!(
        m.decode_step(16, 16 * 1024, par),
        h.decode_step(16, 16 * 1024, par)
    );
    assert_ne!(
        m.decode_step(16, 16 * 1024, par),
        l.decode_step(16, 16 * 1024, par)
    );
    let local = mixed
        .local_prefill_cost()
        .expect("local prefill on the L40S");
    let tp = easerve_model::Parallel::from(mixed.knobs.local_prefill_tp.unwrap());
    assert_eq!(local.prefill(&[2048], tp, 0.5), l.prefill(&[2048], tp, 0.5));
    // one GPU type throughout: no separate local cost
    assert!(load(&[
        ("deployment.groups.encode", "h100"),
        ("deployment.allocation", "2E(TP1)+1P(TP2)+1D(TP4)")
    ])
    .local_prefill_cost()
    .is_none());
}

/// `capacity --target-rate` on node groups answers with the cheapest mix of
/// node counts and stage groups: mixes probed cheapest first, none cheaper
/// than the answer meeting the goal, the answer the best of its cost.
/// Runtime: about 0.5 s in release.
#[test]
fn capacity_target_rate_answers_with_the_cheapest_mix() {
    let f = two_group_with(|s| s.replace("nodes = 1\n", "nodes = 2\n"));
    let out = easerve(&[
        "capacity",
        f.path().to_str().unwrap(),
        "--slo",
        "moderate",
        "--target-rate",
        "10",
        "--requests",
        "300",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ans = &r["answer"];
    assert_eq!(
        (ans["mixes"].as_u64(), ans["assignments"].as_u64()),
        (Some(4), Some(8))
    );
    let probes = ans["probes"].as_array().unwrap();
    let cost = |p: &serde_json::Value| p["cost_per_hour"].as_f64().unwrap();
    let costs: Vec<f64> = probes.iter().map(cost).collect();
    assert!(costs.windows(2).all(|w| w[0] <= w[1]), "{costs:?}");
    let found = &ans["found"];
    assert_eq!(found["probe"]["meets"], true);
    for p in probes {
        let meets = p["probe"]["meets"] == true;
        // nothing cheaper met the goal; nothing at the same cost did better
        assert!(!meets || cost(p) >= cost(found), "{p}");
        if meets && cost(p) == cost(found) {
            assert!(p["probe"]["goodput"].as_f64() <= found["probe"]["goodput"].as_f64());
        }
    }
}

/// Memory is checked per stage on its group's GPU: LLaVA-34B's weights
/// (68 GB) fit an 80 GB H100 at TP1 but not a 48 GB L40S.
#[test]
fn a_stage_is_checked_against_its_own_groups_memory() {
    let f = two_group_with(|s| {
        s.replace("6E(TP1)+1P(TP4)", "4E(TP1)+1P(TP1)")
            .replace("prefill = \"h100\"", "prefill = \"l40s\"")
    });
    rejects(&f, &["deployment.allocation", "prefill at TP1", "on l40s"]);
}

/// `deploy` writes each instance on the node the placement gave it, with
/// its GPUs on that node: the L40S encoders on node 0, prefill and decode
/// on the H100 node 1. Runtime: about 0.3 s in release.
#[test]
fn deploy_writes_each_instance_on_its_placed_node() {
    let dir = tempfile::tempdir().unwrap();
    let path = root().join("scenarios/two-group.toml");
    let out = easerve(&[
        "deploy",
        path.to_str().unwrap(),
        "--requests",
        "50",
        "--emit",
        dir.path().to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read = |f: &str| std::fs::read_to_string(dir.path().join("vllm").join(f)).unwrap();
    assert!(read("E5.sh").contains("CUDA_VISIBLE_DEVICES=5 "));
    for (f, gpus) in [("P0.sh", "0,1,2,3"), ("D0.sh", "4,5,6,7")] {
        let text = read(f);
        assert!(
            text.contains(&format!("CUDA_VISIBLE_DEVICES={gpus} ")),
            "{f}: {text}"
        );
        assert!(text.contains("NODE1_HOST"), "{f}: {text}");
    }
    let proxy = read("proxy.sh");
    assert!(
        proxy.contains("http://${NODE0_HOST:-127.0.0.1}:8100"),
        "{proxy}"
    );
}

/// `sweep` on a cluster of node groups: its default systems (without the
/// one-node `aggregated`) run at every variant of a group field. Runtime:
/// about 1 s in release.
#[test]
fn sweep_runs_a_cluster_of_groups_over_a_group_field() {
    let dir = tempfile::tempdir().unwrap();
    let out = easerve(&[
        "sweep",
        root().join("scenarios/two-group.toml").to_str().unwrap(),
        "--rates",
        "4",
        "--requests",
        "40",
        "--seeds",
        "1",
        "--set",
        "cluster.groups.1.nic_bandwidth_gbs=25,400",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("sweep.json")).unwrap())
            .unwrap();
    let rows = json["rows"].as_array().unwrap();
    let mut seen: Vec<(String, String)> = rows
        .iter()
        .map(|r| {
            assert!(r["throughput"].as_f64().unwrap() > 0.0, "{r}");
            (
                r["variant"].as_str().unwrap().to_string(),
                r["system"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    seen.sort();
    let mut want = Vec::new();
    for v in ["25", "400"] {
        for s in ["easerve", "easerve-s1", "passthrough"] {
            want.push((
                format!("cluster.groups.1.nic_bandwidth_gbs={v}"),
                s.to_string(),
            ));
        }
    }
    assert_eq!(seen, want);
}

/// The search-at-scale bound on a small cluster of two groups
/// (`two-group.toml` cut to 2 L40S + 4 H100, on the file's groups: 9
/// allocations, 552 grid points; with `--all-groups`, over the 6
/// stage-to-group assignments that fit, 31 and 1,768, three times the
/// time): HAS's choice comes within 2 % of the exhaustive grid's best SLO
/// goodput. Runtime: about 1 s in release, under 10 s in debug (the
/// exhaustive grid). On the measured kernel tables the scenario names (`kernels =
/// "auto"`); skipped without them: priced from the roofline instead, HAS
/// finds 4.30 req/s against the grid's 4.40 (2.5 % short, docs/datacenter.md).
/// The bound is held on Stage 2's trials: the file's own deployment, which
/// `search` runs after them, is left out of HAS's best.
#[test]
fn has_comes_within_2_percent_of_exhaustive_search_on_two_groups() {
    if !crate::kernel_data() {
        println!("SKIPPED: ../shared/data/aiconfigurator not found (the bound is held on the measured kernel tables)");
        return;
    }
    let f = small_two_group();
    let goodput = |method: &str| {
        let out = easerve(&[
            "search",
            f.path().to_str().unwrap(),
            "--json",
            "--rate",
            "6",
            "--requests",
            "60",
            "--method",
            method,
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        // HAS: Stage 2's own choice; the file's deployment, which `search`
        // also runs once Stage 2 stops, is left out (it serves 4.42 here)
        let own = |c: &serde_json::Value| {
            c["allocation"]["prefill"]["tp"] == 2
                && c["allocation"]["decode"]["tp"] == 2
                && c["batch"] == 8
                && c["offload"] == 1.0
        };
        s["trials"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["outcome"]["feasible"] == true)
            .filter(|t| method != "has" || !own(&t["candidate"]))
            .map(|t| {
                let o = &t["outcome"];
                o["slo_goodput"]
                    .as_f64()
                    .unwrap_or_else(|| panic!("no goodput in {o}"))
            })
            .fold(0.0, f64::max)
    };
    let (has, best) = (goodput("has"), goodput("exhaustive"));
    assert!(has >= 0.98 * best, "HAS {has} vs exhaustive {best} req/s");
}

/// `two-group.toml` cut to 2 L40S + 4 H100 (the file's deployment
/// `2E(TP1)+1P(TP2)+1D(TP2)`), small enough to search in debug.
fn small_two_group() -> tempfile::NamedTempFile {
    two_group_with(|s| {
        s.replace("gpus_per_node = 6", "gpus_per_node = 2")
            .replace("gpus_per_node = 8", "gpus_per_node = 4")
            .replace("6E(TP1)+1P(TP4)+1D(TP4)", "2E(TP1)+1P(TP2)+1D(TP2)")
    })
}

/// `easerve search FILE --json ARGS…` parsed; panics with stderr on failure.
fn search_json(f: &tempfile::NamedTempFile, args: &[&str]) -> serde_json::Value {
    crate::report_json("search", f.path(), args)
}

/// `search` on node groups enumerates the group of each stage: its space
/// holds the file's assignment first and others (every stage on the H100
/// node among them, leaving the L40S idle and unpaid), Stage 1 scores all
/// of them, and the file's own deployment still runs (without
/// `--all-groups` the space keeps the file's groups alone). Ranked by goodput
/// per dollar, every trial carries its cost per hour (the groups it names:
/// 4 H100 at 3 = 12, plus 2 L40S at 1 when a stage is on them) and the
/// choice has the highest goodput per unit of it. Runtime: about 1 s in
/// release.
#[test]
fn search_on_node_groups_enumerates_stage_groups_and_ranks_by_goodput_per_dollar() {
    let f = small_two_group();
    let args = ["--rate", "2", "--requests", "40", "--budget", "4"];
    let s = search_json(&f, &[&args[..], &["--all-groups"]].concat());
    let groups = |x: &serde_json::Value| -> Vec<String> {
        serde_json::from_value(x["groups"].clone()).unwrap_or_else(|_| panic!("no groups: {x}"))
    };
    let space = s["space"].as_array().unwrap();
    let own = ["l40s", "h100", "h100"].map(String::from).to_vec();
    assert_eq!(groups(&space[0]), own);
    let mut seen: Vec<Vec<String>> = space.iter().map(groups).collect();
    seen.dedup();
    assert!(seen.len() > 1, "{seen:?}");
    let all_h100 = ["h100", "h100", "h100"].map(String::from).to_vec();
    assert!(seen.contains(&all_h100), "{seen:?}");
    let rows = s["stage1"].as_array().unwrap();
    assert!(
        rows.iter().any(|r| groups(r) != own),
        "Stage 1 saw one assignment"
    );
    let file_own = |t: &&serde_json::Value| {
        let c = &t["candidate"];
        groups(c) == own
            && c["batch"] == 8
            && c["offload"] == 1.0
            && c["allocation"]["prefill"]["tp"] == 2
    };
    assert!(s["trials"].as_array().unwrap().iter().any(|t| file_own(&t)));
    let named = search_json(&f, &args);
    let named = named["space"].as_array().unwrap();
    assert!(!named.is_empty() && named.iter().all(|x| groups(x) == own));

    let mut per_dollar = args.to_vec();
    per_dollar.extend(["--objective", "goodput-per-dollar:moderate"]);
    let s = search_json(&f, &per_dollar);
    assert_eq!(s["objective"], "goodput-per-dollar:moderate");
    let score = |t: &serde_json::Value| {
        let o = &t["outcome"];
        let cost = o["cost_per_hour"]
            .as_f64()
            .unwrap_or_else(|| panic!("no cost: {o}"));
        let uses_l40s = groups(&t["candidate"]).contains(&"l40s".to_string());
        assert_eq!(cost, if uses_l40s { 14.0 } else { 12.0 }, "{t}");
        o["slo_goodput"].as_f64().unwrap() / cost
    };
    let trials = s["trials"].as_array().unwrap();
    let best = score(&s["best"]);
    assert!(trials.iter().all(|t| score(t) <= best), "{s}");
}

/// Goodput per dollar needs a cost on every group: without one, `search`
/// and `capacity` exit 2 naming `cluster.groups[i].cost_per_gpu_hour`
/// (a cost on some groups only is refused by validation, naming it too);
/// on a one-node cluster they say it needs node groups.
#[test]
fn goodput_per_dollar_without_a_cost_on_every_group_exits_2_naming_the_field() {
    let f = two_group_with(|s| {
        s.replace("cost_per_gpu_hour = 1.0\n", "")
            .replace("cost_per_gpu_hour = 3.0\n", "")
    });
    let path = f.path().to_str().unwrap();
    let objective = ["--objective", "goodput-per-dollar:moderate"];
    let one_node = root().join("scenarios/image.toml");
    for args in [
        vec!["search", path],
        vec!["capacity", path, "--slo", "moderate"],
        vec!["search", one_node.to_str().unwrap()],
    ] {
        let out = easerve(&[&args[..], &objective[..]].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("cluster.groups[0].cost_per_gpu_hour")
                || err.contains("cluster.groups[i].cost_per_gpu_hour"),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    let some = two_group_with(|s| s.replace("cost_per_gpu_hour = 3.0\n", ""));
    let out = easerve(
        &[
            &["search", some.path().to_str().unwrap()][..],
            &objective[..],
        ]
        .concat(),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("cluster.groups[1].cost_per_gpu_hour"), "{err}");
}
