//! The helper table of docs/reference.md is made from the registry, so the user's
//! reference cannot drift from what the engines run. `BPFTIME_BLESS=1` rewrites it.

use bpftime_isa::helpers::{GpuImpl, REGISTRY};
use std::path::PathBuf;

const BEGIN: &str =
    "<!-- helpers: made from isa/src/helpers.rs by isa/tests/docs_reference.rs -->\n";
const END: &str = "<!-- helpers: end -->\n";

fn table() -> String {
    let mut defs: Vec<_> = REGISTRY.iter().collect();
    defs.sort_by_key(|d| d.id);
    let mut s = String::from("| id | helper | CPU | GPU |\n|---|---|---|---|\n");
    for d in defs {
        let cpu = if d.cpu { "yes" } else { "no" };
        let gpu = match d.gpu {
            GpuImpl::None => "no",
            GpuImpl::Builtin => "yes (built in)",
            GpuImpl::Extern(_) => "yes",
        };
        s += &format!("| {} | `{}` | {cpu} | {gpu} |\n", d.id, d.name);
    }
    s
}

#[test]
fn the_reference_lists_every_helper_as_the_registry_has_it() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/reference.md");
    let doc = std::fs::read_to_string(&path).expect("docs/reference.md");
    let (Some(b), Some(e)) = (doc.find(BEGIN), doc.find(END)) else {
        panic!("docs/reference.md lacks the helper table's markers");
    };
    let current = &doc[b + BEGIN.len()..e];
    let want = table();
    if current == want {
        return;
    }
    if bpftime_golden::blessing() {
        let updated = format!("{}{}{}", &doc[..b + BEGIN.len()], want, &doc[e..]);
        std::fs::write(&path, updated).expect("rewrite docs/reference.md");
        return;
    }
    panic!("docs/reference.md's helper table differs from the registry; run with BPFTIME_BLESS=1 to rewrite it");
}
