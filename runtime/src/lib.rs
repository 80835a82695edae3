//! The shared-memory store (maps, programs, links) and the helpers programs call
