//! Preloaded into a target: opens the store and runs attached programs
