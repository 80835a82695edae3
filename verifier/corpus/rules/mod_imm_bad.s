# modulo by the constant zero
#@ type kprobe
#@ intent reject
ldxdw %r0, [%r1+8]
mod %r0, 0
exit
