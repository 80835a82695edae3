//! Our verifier against the kernel's, program by program, over the committed
//! corpus (`corpus/`): rule pairs written by hand, clang-built tools, and
//! mutations of accepted programs. The kernel (root, so privileged rules) is
//! the oracle: every disagreement is printed; agreement must be at least 99%,
//! and nothing the kernel refuses as unsafe (`EACCES`) may pass ours.

mod oracle;

use bpftime_verifier::{verify, Options, ProgramInfo, Rejection, Verified};
use oracle::{kernel, Entry, Intent};

fn ours(e: &Entry) -> Result<Verified, Rejection> {
    let maps = |imm: i32| e.map(imm);
    let info = ProgramInfo {
        insns: &e.insns,
        prog_type: e.prog_type,
        gpu: false,
        maps: &maps,
        mem_len: 0,
    };
    verify(&info, &Options::default())
}

fn last_line(log: &str) -> &str {
    log.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
}

#[test]
fn corpus_is_large_and_every_entry_prints_back_to_itself() {
    let entries = oracle::load_all();
    assert!(
        entries.len() >= 300,
        "the corpus has {} programs, the issue asks for at least 300",
        entries.len()
    );
    for e in &entries {
        let text = oracle::print(e, &[]);
        let back = oracle::parse(&e.name, &text).unwrap_or_else(|err| panic!("{err}\n{text}"));
        assert_eq!(back.insns, e.insns, "{}: printed as\n{text}", e.name);
        assert_eq!(back.maps, e.maps, "{}", e.name);
    }
}

#[test]
fn every_rule_has_a_safe_and_an_unsafe_program() {
    let entries = oracle::load_all();
    let rules: Vec<&Entry> = entries
        .iter()
        .filter(|e| e.name.starts_with("rules/"))
        .collect();
    for e in &rules {
        let (stem, want) = if let Some(s) = e.name.strip_suffix("_ok") {
            (s, Intent::Accept)
        } else if let Some(s) = e.name.strip_suffix("_bad") {
            (s, Intent::Reject)
        } else {
            panic!(
                "{}: a rule program is named <rule>_ok or <rule>_bad",
                e.name
            )
        };
        assert_eq!(
            e.intent,
            Some(want),
            "{}: intent does not match its name",
            e.name
        );
        let other = match want {
            Intent::Accept => format!("{stem}_bad"),
            Intent::Reject => format!("{stem}_ok"),
        };
        assert!(
            rules.iter().any(|r| r.name == other),
            "{} has no partner {other}",
            e.name
        );
    }
}

#[test]
fn committed_mutations_are_what_the_generator_makes() {
    let entries = oracle::load_all();
    let committed: Vec<&Entry> = entries
        .iter()
        .filter(|e| e.name.starts_with("mutations/"))
        .collect();
    let made: Vec<Entry> = entries
        .iter()
        .flat_map(oracle::mutate::corpus_mutants)
        .map(|(e, _)| e)
        .collect();
    let regen = "regenerate with: cargo run --release -p bpftime-verifier --example corpus_gen";
    assert_eq!(committed.len(), made.len(), "{regen}");
    for m in &made {
        let c = committed
            .iter()
            .find(|c| c.name == m.name)
            .unwrap_or_else(|| panic!("{} is not committed; {regen}", m.name));
        assert_eq!(c.insns, m.insns, "{} differs; {regen}", m.name);
        assert_eq!(c.maps, m.maps, "{} differs; {regen}", m.name);
    }
}

#[test]
fn our_verifier_agrees_with_the_kernel_on_the_corpus() {
    let entries = oracle::load_all();
    if let Some(why) = kernel::unavailable() {
        eprintln!("skipping the kernel comparison: {why}");
        return;
    }
    let mut agree = 0usize;
    let mut disagreements = Vec::new();
    let mut unsafe_accepted = Vec::new();
    let mut mislabeled = Vec::new();
    // Per corpus part: (programs, the kernel accepts, we agree).
    let mut parts: std::collections::BTreeMap<&str, (usize, usize, usize)> = Default::default();
    for e in &entries {
        let maps = kernel::create_maps(e).unwrap_or_else(|err| panic!("{err}"));
        let k = maps.load(e);
        let o = ours(e);
        let k_ok = k.is_ok();
        if let (Some(intent), Err(r)) = (e.intent, &k) {
            if intent == Intent::Accept {
                mislabeled.push(format!(
                    "{}: meant to pass, kernel: {}",
                    e.name,
                    r.last_line()
                ));
            }
        }
        if e.intent == Some(Intent::Reject) && k_ok {
            mislabeled.push(format!("{}: meant to fail, kernel accepts", e.name));
        }
        let part = parts
            .entry(e.name.split('/').next().unwrap_or(""))
            .or_default();
        part.0 += 1;
        part.1 += usize::from(k_ok);
        if k_ok == o.is_ok() {
            part.2 += 1;
            agree += 1;
            continue;
        }
        let kernel_says = match &k {
            Ok(_) => "accepted".to_string(),
            Err(r) => format!(
                "rejected ({}): {}",
                std::io::Error::from_raw_os_error(r.errno),
                r.last_line()
            ),
        };
        let ours_says = match &o {
            Ok(v) => format!("accepted ({} insns processed)", v.insns_processed),
            Err(r) => format!("rejected: {}", last_line(&r.log())),
        };
        let line = format!(
            "{}\n    kernel: {kernel_says}\n    ours:   {ours_says}",
            e.name
        );
        if matches!(&k, Err(r) if r.errno == libc::EACCES) {
            unsafe_accepted.push(line.clone());
        }
        disagreements.push(line);
    }
    let total = entries.len();
    eprintln!(
        "{agree} of {total} programs agree ({:.2}%); {} disagreements:",
        100.0 * agree as f64 / total as f64,
        disagreements.len()
    );
    for d in &disagreements {
        eprintln!("  {d}");
    }
    for (part, (n, accepted, agreed)) in &parts {
        eprintln!("{part}: {n} programs, {accepted} accepted by the kernel, {agreed} agree");
    }
    if !mislabeled.is_empty() {
        eprintln!("entries whose intent the kernel does not share:");
        for m in &mislabeled {
            eprintln!("  {m}");
        }
    }
    assert!(
        unsafe_accepted.is_empty(),
        "programs the kernel refuses as unsafe (EACCES) pass our verifier:\n{}",
        unsafe_accepted.join("\n")
    );
    assert!(
        agree * 100 >= total * 99,
        "agreement {agree}/{total} is below 99%"
    );
}

/// `n` mutants of `base`, each mutated `DEPTH` times (default 1).
fn explored(base: &Entry, n: usize) -> Vec<(Entry, String)> {
    let depth: usize = std::env::var("DEPTH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mut out = oracle::mutate::mutants(base, n);
    for (e, what) in &mut out {
        let mut rng = oracle::mutate::Rng::seeded(&e.name, depth as u64);
        for _ in 1..depth {
            if let Some((insns, w)) = oracle::mutate::mutate(&e.insns, &mut rng) {
                e.insns = insns;
                *what = format!("{what}; {w}");
            }
        }
    }
    out
}

/// Bug hunting beyond the committed corpus: `MUTANTS=n` mutants of every
/// program meant to pass, each compared with the kernel; prints disagreements.
#[test]
#[ignore]
fn explore_mutants() {
    let n: usize = std::env::var("MUTANTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    if let Some(why) = kernel::unavailable() {
        eprintln!("skipping: {why}");
        return;
    }
    let mut total = 0;
    let mut bad = 0;
    for base in oracle::load_all() {
        if oracle::mutate::corpus_mutants(&base).is_empty() {
            continue;
        }
        for (e, what) in explored(&base, n) {
            total += 1;
            let maps = kernel::create_maps(&e).unwrap();
            let k = maps.load(&e);
            let o = ours(&e);
            if k.is_ok() != o.is_ok() {
                bad += 1;
                let ks = match &k {
                    Ok(_) => "accepted".to_string(),
                    Err(r) => format!("errno {} {}", r.errno, r.last_line()),
                };
                let os = match &o {
                    Ok(_) => "accepted".to_string(),
                    Err(r) => last_line(&r.log()).to_string(),
                };
                println!("{} ({what}) kernel: {ks} | ours: {os}", e.name);
            }
        }
    }
    println!("{bad} of {total} disagree");
}

/// `SHOW=name` (a corpus entry or `base#k` for the k-th explored mutant):
/// prints the program, both verdicts and our verbose log.
#[test]
#[ignore]
fn show() {
    let want = std::env::var("SHOW").unwrap_or_default();
    let (base, k) = match want.split_once('#') {
        Some((b, k)) => (b.to_string(), k.parse::<usize>().unwrap()),
        None => (want.clone(), 0),
    };
    let all = oracle::load_all();
    let e = all
        .iter()
        .find(|e| e.name == base)
        .expect("no such entry")
        .clone();
    let e = if k > 0 {
        explored(&e, k).pop().unwrap().0
    } else {
        e
    };
    println!("{}", oracle::print(&e, &[]));
    if kernel::unavailable().is_none() {
        let maps = kernel::create_maps(&e).unwrap();
        match maps.load(&e) {
            Ok(_) => println!("kernel: accepted"),
            Err(r) => println!("kernel: errno {}\n{}", r.errno, r.log),
        }
    }
    let maps = |imm: i32| e.map(imm);
    let info = ProgramInfo {
        insns: &e.insns,
        prog_type: e.prog_type,
        gpu: false,
        maps: &maps,
        mem_len: 0,
    };
    match verify(
        &info,
        &Options {
            log_level: 2,
            ..Options::default()
        },
    ) {
        Ok(v) => println!("ours: accepted\n{}", v.log),
        Err(r) => println!("ours:\n{}", r.log()),
    }
}
