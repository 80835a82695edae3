# a tracepoint program writing its record
#@ type tracepoint
#@ intent reject
stdw [%r1+16], 0
mov %r0, 0
exit
