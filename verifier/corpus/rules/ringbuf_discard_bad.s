# one path forgets the record
#@ type kprobe
#@ intent reject
#@ map rb ringbuf 0 0 4096
ldxdw %r6, [%r1+8]
ldmap %r1, rb
mov %r2, 16
mov %r3, 0
call 131
jeq %r0, 0, out
mov %r1, %r0
mov %r2, 0
jeq %r6, 0, out
call 132
out:
mov %r0, 0
exit
