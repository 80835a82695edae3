# the reserved size is not a known constant
#@ type kprobe
#@ intent reject
#@ map rb ringbuf 0 0 4096
ldxdw %r2, [%r1+8]
and %r2, 31
ldmap %r1, rb
mov %r3, 0
call 131
jeq %r0, 0, out
mov %r1, %r0
mov %r2, 0
call 133
out:
mov %r0, 0
exit
