# the base register of a load was never written
#@ type kprobe
#@ intent reject
ldxdw %r0, [%r7+8]
exit
