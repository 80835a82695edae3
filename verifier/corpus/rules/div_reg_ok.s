# division by a register that may be zero is defined (result 0)
#@ type kprobe
#@ intent accept
ldxdw %r0, [%r1+8]
ldxdw %r2, [%r1+16]
div %r0, %r2
exit
