//! The agent: preloaded into a target process (`bpftime start`), it opens the
//! store, loads every program linked to a point in this process, and attaches
//! it with inline hooks. A watcher thread follows the store, so tools loaded
//! later attach without a restart and tools that exit detach.

mod program;
mod watch;

/// Runs when the dynamic loader maps this library into the target, before `main`.
extern "C" fn agent_init() {
    if std::env::var_os("BPFTIME_AGENT_DISABLE").is_some() {
        return;
    }
    // A failing agent must never take the target down with it.
    if std::panic::catch_unwind(watch::start).is_err() {
        eprintln!("bpftime agent: internal error during start; the target runs uninstrumented");
    }
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = agent_init;
