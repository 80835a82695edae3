# 32-bit arithmetic on a pointer
#@ type kprobe
#@ intent reject
add32 %r1, 4
mov %r0, 0
exit
