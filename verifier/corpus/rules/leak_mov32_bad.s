# the low half of a pointer cannot be dereferenced
#@ type kprobe
#@ intent reject
mov32 %r2, %r10
ldxdw %r0, [%r2-8]
exit
