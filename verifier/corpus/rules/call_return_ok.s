# the callee returns a number
#@ type kprobe
#@ intent accept
call local f
exit
f:
stdw [%r10-8], 3
ldxdw %r0, [%r10-8]
exit
