# the frame pointer itself is past the stack
#@ type kprobe
#@ intent reject
stdw [%r10+0], 42
ldxdw %r0, [%r10-8]
exit
