# a loop whose bound comes from the context
#@ type kprobe
#@ intent reject
ldxdw %r2, [%r1+8]
mov %r0, 0
loop:
add %r0, 1
jne %r0, %r2, loop
exit
