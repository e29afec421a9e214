//! The benchmark CLI works end to end on a tiny table: required JSON fields, every structure
//! present, equal checksums across the hash tables, clear errors on bad arguments. (Functional
//! only: no timing is asserted.)

use std::collections::HashSet;
use std::process::Command;

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_embstore-bench")).args(args).output().expect("run bench")
}

#[test]
fn index_json_lines_have_the_required_fields_and_equal_checksums() {
    let out = bench(&["index", "--size", "4096", "--reps", "2", "--queries", "5000", "--json"]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    let mut names = HashSet::new();
    for dist in ["uniform", "zipf0.99"] {
        let rows: Vec<&serde_json::Value> =
            lines.iter().filter(|l| l["bench"] == "index" && l["distribution"] == dist).collect();
        // Paired ratios ours / theirs, per repetition, beside the rows.
        let pairs: Vec<&serde_json::Value> = lines
            .iter()
            .filter(|l| l["bench"] == "index_paired_ratio" && l["distribution"] == dist)
            .collect();
        assert!(
            pairs.iter().any(|p| p["reference"] == "random_access_prefetch"
                && p["ratios"].as_array().is_some_and(|r| r.len() == 2)),
            "{dist}: {pairs:?}"
        );
        let tables: Vec<&&serde_json::Value> = rows
            .iter()
            .filter(|r| !r["structure"].as_str().unwrap().starts_with("random"))
            .collect();
        assert!(tables.len() >= 5, "{dist}: {rows:?}");
        assert!(tables.iter().all(|r| r["checksum"] == tables[0]["checksum"]), "{dist}");
        for r in &rows {
            assert_eq!(r["size"], 4096);
            assert!(r["mops"].as_f64().unwrap() > 0.0);
            let s = r["structure"].as_str().unwrap();
            assert_eq!(r["apcl"].is_null(), !s.starts_with("embstore"), "{s}");
            names.insert(s.to_string());
        }
    }
    for s in [
        "embstore_scalar",
        "embstore_batch",
        "hashbrown",
        "random_access",
        "random_access_prefetch",
    ] {
        assert!(names.contains(s), "missing {s}");
    }
}

#[test]
fn bad_sizes_are_clear_errors() {
    let out = bench(&["index", "--size", "1000", "--reps", "1", "--queries", "10"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--size must be a power of two"));
    let out = bench(&["index", "--size", "many"]);
    assert!(!out.status.success());
}
