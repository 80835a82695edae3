# a reserved record is discarded on one path, submitted on the other
#@ type kprobe
#@ intent accept
#@ map rb ringbuf 0 0 4096
ldxdw %r6, [%r1+8]
ldmap %r1, rb
mov %r2, 16
mov %r3, 0
call 131
jeq %r0, 0, out
mov %r1, %r0
mov %r2, 0
jeq %r6, 0, drop
call 132
ja out
drop:
call 133
out:
mov %r0, 0
exit
