# stack accesses must be aligned
#@ type kprobe
#@ intent reject
stw [%r10-6], 1
ldxw %r0, [%r10-6]
exit
