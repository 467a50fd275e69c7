# Medians of the stages between the timing stamps of the result records in a Redis (a throw-away
# check of ferry-bench's "stage p50 us" line). Usage: /usr/bin/python3 stage_check.py REDIS_PORT [KEY_PREFIX]
# (needs python3-msgpack; reads every ferry:result:* key, so FLUSHALL before the run).
import socket, sys, msgpack, statistics
port=int(sys.argv[1]); prefix=sys.argv[2] if len(sys.argv)>2 else 'ferry:result:'
s=socket.create_connection(('127.0.0.1',port)); f=s.makefile('rb')
def cmd(*a):
    out=b'*%d\r\n'%len(a)
    for x in a:
        x=x if isinstance(x,bytes) else str(x).encode(); out+=b'$%d\r\n%s\r\n'%(len(x),x)
    s.sendall(out); return rd()
def rd():
    l=f.readline(); t=l[:1]; b=l[1:-2]
    if t==b'+': return b
    if t==b'-': raise Exception(b)
    if t==b':': return int(b)
    if t==b'$':
        n=int(b); 
        if n<0: return None
        d=f.read(n+2); return d[:-2]
    if t==b'*':
        n=int(b); return [rd() for _ in range(n)]
keys=[]; cur=b'0'
while True:
    cur,ks=cmd('SCAN',cur,'MATCH',prefix+'*','COUNT',1000); keys+=ks
    if cur==b'0': break
recs=[]
for i in range(0,len(keys),500):
    for v in cmd('MGET',*keys[i:i+500]):
        if v: recs.append(msgpack.unpackb(v,raw=False))
st={'queue':('submitted','dispatched'),'transfer':('dispatched','received'),'worker':('received','compute_start'),'compute':('compute_start','compute_end'),'write':('compute_end','finished')}
print(len(recs),'records')
for name,(a,b) in st.items():
    xs=[r['timing'][b]-r['timing'][a] for r in recs if a in r.get('timing',{}) and b in r.get('timing',{})]
    if xs: print(f"{name:9s} p50 {statistics.median(xs):7.1f} us  mean {statistics.mean(xs):7.1f}")
