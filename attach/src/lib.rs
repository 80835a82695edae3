//! Attaches programs to CPU functions with inline hooks (uprobes, uretprobes)
