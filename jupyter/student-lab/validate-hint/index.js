// After nbgrader's Validate says "Success!", ask the server what hidden checks are worth in this
// notebook (devcourse/labhints.py reads the marks the course's build writes into test cells) and
// add those lines to the same dialog. It imports nothing: the app object is all it needs.
const plugin = {
  id: 'course-validate-hint:plugin',
  description: "Adds the points that hidden checks are worth to Validate's success message.",
  autoStart: true,
  activate: app => {
    const settings = app.serviceManager.serverSettings;
    const done = new WeakSet();
    const addTo = async node => {
      done.add(node);
      const widget = app.shell.currentWidget;
      const path = widget && widget.context && widget.context.path;
      if (!path || !path.endsWith('.ipynb')) {
        return;
      }
      const headers = settings.token ? { Authorization: `token ${settings.token}` } : {};
      const url = `${settings.baseUrl}course/hidden-points?path=${encodeURIComponent(path)}`;
      let reply;
      try {
        reply = await fetch(url, { headers, credentials: 'same-origin' });
      } catch (error) {
        console.warn('course-validate-hint: no answer from the server', error);
        return;
      }
      if (!reply.ok) {
        console.warn(`course-validate-hint: ${url} answered ${reply.status}`);
        return;
      }
      const { lines } = await reply.json();
      const box = document.createElement('div');
      box.className = 'course-hidden-points';
      for (const line of lines) {
        const paragraph = document.createElement('p');
        paragraph.innerText = line;
        box.append(paragraph);
      }
      node.append(box);
    };
    new MutationObserver(() => {
      for (const node of document.querySelectorAll('#validation-message.validation-success')) {
        if (!done.has(node)) {
          addTo(node);
        }
      }
    }).observe(document.body, { childList: true, subtree: true });
  }
};

export default plugin;
