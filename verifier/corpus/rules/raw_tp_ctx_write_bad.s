# a raw tracepoint program writing its arguments
#@ type raw_tracepoint
#@ intent reject
stdw [%r1+8], 1
mov %r0, 0
exit
