# a tracepoint program reading __syscall_nr, just past the common_* fields
#@ type tracepoint
#@ intent accept
ldxw %r0, [%r1+8]
exit
