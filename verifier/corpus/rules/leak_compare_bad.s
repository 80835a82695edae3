# comparing a pointer with an uninitialised register
#@ type kprobe
#@ intent reject
mov %r0, 0
mov %r2, %r10
jgt %r2, %r3, +1
mov %r0, 1
exit
