# a moved context pointer cannot be dereferenced
#@ type kprobe
#@ intent reject
add %r1, 8
ldxdw %r0, [%r1]
exit
