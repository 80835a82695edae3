# a raw tracepoint program reading past the 12 arguments a context can hold
#@ type raw_tracepoint
#@ intent reject
ldxdw %r0, [%r1+96]
exit
