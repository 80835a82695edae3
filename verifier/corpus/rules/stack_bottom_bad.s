# 520 bytes down is below the stack
#@ type kprobe
#@ intent reject
stdw [%r10-520], 1
ldxdw %r0, [%r10-520]
exit
