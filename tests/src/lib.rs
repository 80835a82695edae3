//! End-to-end tests with real loaders, real targets and the kernel as oracle
