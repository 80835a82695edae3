# reserve from a ring buffer
#@ type kprobe
#@ intent accept
#@ map rb ringbuf 0 0 4096
ldmap %r1, rb
mov %r2, 8
mov %r3, 0
call 131
jeq %r0, 0, out
mov %r1, %r0
mov %r2, 0
call 133
out:
mov %r0, 0
exit
