# modulo alone leaves no bounds on the index (the kernel tracks none for it)
#@ type kprobe
#@ intent reject
#@ map arr array 4 64 1
ldxdw %r6, [%r1+8]
mod %r6, 64
ldmapval %r1, arr, 0
add %r1, %r6
ldxb %r0, [%r1]
exit
